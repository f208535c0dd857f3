"""The load of the proxy benchmark: blocks of requests at a fixed concurrency, 1,000 streams
held open at once, and a ``previous_response_id`` chain.

Each function drives real servers over loopback with httpx and returns plain figures;
:mod:`bench.proxy` decides what runs where, :mod:`bench.proxy_report` what they mean. Each
request is timed from the moment it is sent: its first byte (the answer's head), its
first text (a :class:`Probe` pattern, looked for in each piece of the body as it arrives)
and its end. The client is the same for every target, so its own cost cancels in the
differences.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_aiohttp import AiohttpTransport

from bench.procfs import family_cpu_seconds, family_rss_mib


@dataclass(frozen=True)
class Probe:
    """What marks the first text of an answer, and the end of a stream (a terminal event;
    a JSON answer has none: it is complete when its body is)."""

    text: re.Pattern[bytes]
    terminal: re.Pattern[bytes]


RESPONSES_PROBE = Probe(re.compile(rb"event: response\.output_text\.delta\n"),
                        re.compile(rb"event: response\.(?:completed|failed|incomplete)\n"))
"""``POST /v1/responses``: an ``output_text`` delta; a terminal event."""
CHAT_PROBE = Probe(re.compile(rb'"content":"[^"]'), re.compile(rb"data: \[DONE\]"))
"""``POST /chat/completions``: a chunk (or completion) with content; ``[DONE]``."""
_OVERLAP = 64
"""Bytes of the previous piece searched again with the next (a marker may straddle two)."""
_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@dataclass(frozen=True)
class Request:
    """A ``POST`` of a JSON body, encoded once."""

    path: str
    body: bytes


def post(path: str, body: dict[str, Any]) -> Request:
    return Request(path, json.dumps(body, separators=(",", ":")).encode())


@dataclass(slots=True)
class Exchange:
    """One request's answer. Times are seconds from the moment the request was sent;
    ``started`` is that moment (``time.perf_counter``)."""

    started: float
    status: int = 0
    first_byte: float = 0.0
    first_text: float | None = None
    end: float = 0.0
    terminal: bool = False
    error: str | None = None
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return self.error is None and 200 <= self.status < 300

    def json(self) -> Any:
        return json.loads(self.body)


def client(port: int, connections: int | None, *, verify: ssl.SSLContext | bool = True) -> httpx.AsyncClient:
    """A client of ``127.0.0.1:port`` holding at most ``connections`` connections (kept
    alive), never through a proxy. httpx on aiohttp's transport (``httpx-aiohttp``, what
    openai-python offers for speed): the load generator shares the machine's cores with
    the servers it measures, so the less CPU it spends per request, the less its own cost
    shows in theirs."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=None,
                             transport=AiohttpTransport(verify=verify, limits=limits, trust_env=False))


async def send(http: httpx.AsyncClient, request: Request, probe: Probe, *, keep_body: bool = False,
                   timeout: float = 120) -> Exchange:
    """Send ``request``, read the whole answer. Failures are recorded on the result
    (``error``), never raised."""
    started = time.perf_counter()
    result = Exchange(started)
    body: list[bytes] = []
    tail = b""
    try:
        async with asyncio.timeout(timeout):
            async with http.stream("POST", request.path, content=request.body, headers=_HEADERS) as reply:
                result.first_byte = time.perf_counter() - started
                result.status = reply.status_code
                async for data in reply.aiter_raw():
                    window = tail + data
                    if result.first_text is None and probe.text.search(window):
                        result.first_text = time.perf_counter() - started
                    if not result.terminal and probe.terminal.search(window):
                        result.terminal = True
                    tail = window[-_OVERLAP:]
                    if keep_body:
                        body.append(data)
    except (httpx.HTTPError, OSError, TimeoutError) as exc:
        result.error = type(exc).__name__
    result.end = time.perf_counter() - started
    result.body = b"".join(body)
    return result


@dataclass(frozen=True)
class Target:
    """Somewhere to send requests: the stub directly, or ors (stored or not). ``pid`` is
    the process whose CPU time is counted; ``requests`` the prepared request per format
    (``json``, ``sse``)."""

    name: str
    port: int
    pid: int
    requests: dict[str, Request]
    probe: Probe


@dataclass
class Samples:
    """What blocks of requests measured, merged over the rounds of a run."""

    latency: list[float] = field(default_factory=list)
    first_byte: list[float] = field(default_factory=list)
    first_text: list[float] = field(default_factory=list)
    new_connection: list[float] = field(default_factory=list)
    """The latency of each connection's first request (outside the other figures)."""
    requests: int = 0
    failures: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0

    def merge(self, other: Samples) -> None:
        self.latency += other.latency
        self.first_byte += other.first_byte
        self.first_text += other.first_text
        self.new_connection += other.new_connection
        self.requests += other.requests
        self.failures += other.failures
        self.wall_s += other.wall_s
        self.cpu_s += other.cpu_s


async def block(target: Target, fmt: str, concurrency: int, count: int) -> Samples:
    """``count`` requests of format ``fmt`` on ``concurrency`` kept-alive connections, each
    sent as soon as its connection's previous answer ended. The connections are opened,
    and each carries one request, before the clock starts: a connection's first request
    also waits for the server to accept the connection, and was above the p99 of its
    target in most blocks, the stub's included, so it measured connection set-up in the
    tail of every figure. Its latency is kept apart (``new_connection``). The CPU time of
    the target and its processes (SQLite's writer, workers) is read around the block."""
    request = target.requests[fmt]
    samples = Samples()
    async with client(target.port, concurrency) as http:
        for first in await asyncio.gather(*(send(http, request, target.probe) for _ in range(concurrency))):
            if first.ok:
                samples.new_connection.append(first.end)
        left = count

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                _record(samples, await send(http, request, target.probe))

        cpu = family_cpu_seconds(target.pid)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        samples.wall_s = time.perf_counter() - started
        samples.cpu_s = family_cpu_seconds(target.pid) - cpu
    return samples


def _record(samples: Samples, exchange: Exchange) -> None:
    samples.requests += 1
    if not exchange.ok:
        samples.failures += 1
        return
    samples.latency.append(exchange.end)
    samples.first_byte.append(exchange.first_byte)
    if exchange.first_text is not None:
        samples.first_text.append(exchange.first_text)


# ---------------------------------------------------------------- streams held open at once

_TERMINAL = re.compile(rb"event: response\.(completed|failed|incomplete)\n")
_FAILURE_CODE = re.compile(rb'event: response\.failed\ndata: .*?"error":\s*\{[^}]*?"code":\s*"([^"]+)"')


async def open_streams(port: int, pid: int, model: str, count: int, hold_s: float) -> dict[str, object]:
    """``count`` streaming requests through ors, all sent at once, for ``model`` (a stub
    model that holds each stream ``hold_s`` seconds after its first text). Counts the
    streams that received text, that ended with a terminal event (and which), and that
    were cut without one; how many were open with text at the same moment; the resident
    memory of the server and its processes before, at its peak and after (sampled every 0.1 s)."""
    request = post("/v1/responses", {"model": model, "input": "Hi", "stream": True})
    baseline = family_rss_mib(pid)
    samples: list[tuple[float, float]] = []
    started = time.perf_counter()
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            samples.append((time.perf_counter() - started, family_rss_mib(pid)))
            await asyncio.sleep(0.1)

    tls = httpx.create_ssl_context()  # made once: a client's own would load the trusted certificates each time

    async def one() -> Exchange:
        # a client of its own for each stream: httpcore's pool looks at each of its
        # connections on every request and every close, which one pool of a thousand
        # connections would pay a million times over in this process
        async with client(port, 1, verify=tls) as http:
            return await send(http, request, RESPONSES_PROBE, keep_body=True, timeout=hold_s + 120)

    sampler = asyncio.create_task(sample())
    exchanges = await asyncio.gather(*(one() for _ in range(count)))
    wall = time.perf_counter() - started
    done.set()
    await sampler
    await asyncio.sleep(1)
    terminals: dict[str, int] = {}
    failures: dict[str, int] = {}
    for exchange in exchanges:
        if exchange.terminal and (found := _TERMINAL.findall(exchange.body)):
            kind = found[-1].decode()
            terminals[kind] = terminals.get(kind, 0) + 1
        if code := _FAILURE_CODE.search(exchange.body):
            failures[code[1].decode()] = failures.get(code[1].decode(), 0) + 1
    errors: dict[str, int] = {}
    for exchange in exchanges:
        if not exchange.ok:
            key = exchange.error or f"HTTP {exchange.status}"
            errors[key] = errors.get(key, 0) + 1
    ended = sum(exchange.terminal for exchange in exchanges)
    return {
        "streams": count, "hold_s": hold_s, "wall_s": wall,
        "received_text": sum(exchange.first_text is not None for exchange in exchanges),
        "ended_with_terminal_event": ended, "terminal_events": terminals, "failure_codes": failures,
        "cut": count - ended, "errors": errors,
        "open_with_text_at_once": _open_at_once(exchanges, started, hold_s),
        "rss_mib_before": baseline, "rss_mib_peak": max((rss for _, rss in samples), default=baseline),
        "rss_mib_after": family_rss_mib(pid), "rss_mib_timeline": [(round(t, 2), round(rss, 1)) for t, rss in samples],
        "open_with_text_timeline": _open_timeline(exchanges, started, [t for t, _ in samples]),
    }


def _open_at_once(exchanges: list[Exchange], origin: float, hold_s: float) -> int:
    """The streams that received text less than ``hold_s`` after the burst began. They
    were all open at one moment, the last of those first texts: a stream ends no sooner
    than ``hold_s`` after its first text. A stream that had to wait for another to end
    (a bounded pool on the way) gets its text later, and is not counted."""
    return sum(exchange.first_text is not None and exchange.started - origin + exchange.first_text < hold_s
               for exchange in exchanges)


def _open_timeline(exchanges: list[Exchange], origin: float, moments: list[float]) -> list[tuple[float, int]]:
    """How many streams had received text and not yet ended, at each of ``moments``."""
    spans = [(exchange.started - origin + exchange.first_text, exchange.started - origin + exchange.end)
             for exchange in exchanges if exchange.first_text is not None]
    return [(round(moment, 2), sum(first <= moment < end for first, end in spans)) for moment in moments]


# ---------------------------------------------------------------- a previous_response_id chain


CHAIN_ALTERNATIONS = 60
"""Turns 2 and N measured in alternation, each this many times, after the chain is built."""


async def chain(port: int, model: str, turns: int, direct_port: int | None = None) -> dict[str, object]:
    """A stored conversation of ``turns`` turns, each continuing the last with
    ``previous_response_id`` and a small input (a JSON response, sequentially on one
    connection); then the cost of turn 2 and of turn N measured in alternation, so that
    drift of the machine falls on both alike: each alternation continues the chain's
    first response (a turn 2) and its second-to-last one (a turn N, with the whole
    conversation behind it). The sequential turns' medians (2-12 and the last 11) are
    reported too. With ``direct_port`` (the upstream), the same conversations are also
    sent to it directly as Chat Completions requests: what the upstream itself takes to
    read a conversation that long, so that what ors adds can be told from it."""
    http = client(port, 1)
    ids: list[str] = []
    timings: list[float] = []
    failure = None

    async def turn(previous: str | None) -> tuple[float, str] | None:
        nonlocal failure
        body: dict[str, object] = {"model": model, "input": "next"}
        if previous is not None:
            body["previous_response_id"] = previous
        answer = await send(http, post("/v1/responses", body), RESPONSES_PROBE, keep_body=True)
        if not answer.ok:
            failure = f"turn {len(timings) + 1}: {answer.error or answer.status} {answer.body[:300]!r}"
            return None
        return answer.end, answer.json()["id"]

    for _ in range(turns):
        done = await turn(ids[-1] if ids else None)
        if done is None:
            break
        timings.append(done[0])
        ids.append(done[1])
    early = late = None
    if len(ids) >= 23 and failure is None:
        alternated: dict[str, list[float]] = {"early": [], "late": []}
        for _ in range(CHAIN_ALTERNATIONS):
            for key, parent in (("early", ids[0]), ("late", ids[-2])):
                done = await turn(parent)
                if done is not None:
                    alternated[key].append(done[0])
        if alternated["early"] and alternated["late"]:
            early, late = statistics.median(alternated["early"]), statistics.median(alternated["late"])
    await http.aclose()
    sequential_early = statistics.median(timings[1:12]) if len(timings) >= 12 else None
    sequential_late = statistics.median(timings[-11:]) if len(timings) >= 23 else None
    direct: dict[str, float | None] = {"early_ms": None, "late_ms": None}
    if direct_port is not None and early and late:
        count = len(ids)
        direct["early_ms"] = await _direct_turns(direct_port, model, [2] * 11) * 1000
        direct["late_ms"] = await _direct_turns(direct_port, model, [count] * 11) * 1000
    added_early = early * 1000 - direct["early_ms"] if early and direct["early_ms"] is not None else None
    added_late = late * 1000 - direct["late_ms"] if late and direct["late_ms"] is not None else None
    return {"turns": turns, "completed_turns": len(timings), "failure": failure,
            "early_turns": "2", "late_turns": f"{len(ids)}", "alternations": CHAIN_ALTERNATIONS,
            "early_ms": early * 1000 if early else None, "late_ms": late * 1000 if late else None,
            "late_over_early": late / early if early and late else None,
            "sequential_early_ms": sequential_early * 1000 if sequential_early else None,
            "sequential_late_ms": sequential_late * 1000 if sequential_late else None,
            "direct_early_ms": direct["early_ms"], "direct_late_ms": direct["late_ms"],
            "added_early_ms": added_early, "added_late_ms": added_late,
            "added_late_over_early": added_late / added_early if added_early and added_late else None,
            "timings_ms": [round(t * 1000, 3) for t in timings]}


async def _direct_turns(port: int, model: str, turns: Sequence[int], repeats: int = 3) -> float:
    """The median time the upstream itself takes (Chat Completions, JSON) for the
    conversation ors sends it at each of ``turns``: the user's ``next`` after every
    earlier turn's ``next`` and answer."""
    http = client(port, 1)
    times: list[float] = []
    for turn in turns:
        messages: list[dict[str, str]] = []
        for _ in range(turn - 1):
            messages += [{"role": "user", "content": "next"}, {"role": "assistant", "content": "Hello, world."}]
        messages.append({"role": "user", "content": "next"})
        request = post("/v1/chat/completions", {"model": model, "messages": messages, "stream": True,
                                                "stream_options": {"include_usage": True}})
        for _ in range(repeats):
            answer = await send(http, request, CHAT_PROBE)
            if answer.ok:
                times.append(answer.end)
    await http.aclose()
    return statistics.median(times)
