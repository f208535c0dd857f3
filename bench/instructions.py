"""Instructions per request: what ors's own work costs, counted instead of timed.

Timed figures on a small shared machine move by tens of percent from one hour to the
next, and two processes of the same build differ by several percent (each has its own
memory layout and hash seed): more than one step of work on the hot path saves. Valgrind's
callgrind counts the instructions a process executes, which for the same code and the
same requests stay within a few tenths of a percent whatever else the machine does.

For each target (ors with ``store: false``, ors stored, and the floor of
:mod:`bench.floor` for reference) and each format (``json``, ``sse``), a child process
run under callgrind makes the target's ASGI app, starts it (lifespan), sends it
``--warm`` requests, zeroes the counters (``callgrind_control -z``), sends ``--requests``
more one at a time, and dumps the counters (``callgrind_control -d``); the figure is the
dump's total over the requests. The requests go straight to the app, in process, and the
app's upstream is the stub of :mod:`bench.stub` on loopback (outside valgrind): counted
is everything the server's process does for a request except uvicorn's HTTP parsing and
the kernel's work, the same for ors and the floor. ors logs as ``ors serve`` does (an
access line per request, written in bulk). Each answer is checked (a completed response
or its terminal event).

Run: ``python -m bench instructions`` (a few minutes: valgrind runs Python some fifty
times slower; two children at a time). Prints the counts, ors's over the floor's, and
writes ``bench/results/instructions-<time>.json``. Needs valgrind; without it, says so
and stops. Not part of ``make bench``: a tool for comparing two builds, not a target.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.proxy_report import RESULTS
from bench.stub import MODEL, StubProcess
from tests.live import free_port

TARGETS = ("unstored", "stored", "floor")
FORMATS = ("json", "sse")
UNDER_CALLGRIND = "ORS_BENCH_UNDER_CALLGRIND"
"""Set by the parent for a child run under callgrind: only then does the child call
``callgrind_control`` on itself."""

ASGIApp = Callable[..., Any]


def _app(target: str, upstream: str, data_dir: Path) -> ASGIApp:
    """The ASGI app of ``target`` in front of ``upstream`` (ors: defaults, a fresh SQLite
    store in ``data_dir``, the stub's model as the default)."""
    if target == "floor":
        from bench.floor import Floor

        return Floor(upstream)
    from app.config import Settings
    from app.main import create_app

    return create_app(Settings(upstream_url=upstream, default_model=MODEL, data_dir=data_dir))


def _scope(body: bytes, state: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": "/v1/responses", "raw_path": b"/v1/responses",
        "root_path": "", "query_string": b"", "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8080),
        "headers": [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
        "state": dict(state),
    }


async def _request(app: ASGIApp, body: bytes, state: dict[str, Any], stream: bool) -> None:
    """One ``POST /v1/responses`` through ``app``; raises unless it completed."""
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Future()  # the client stays until the answer is over
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(_scope(body, state), receive, send)
    answer = b"".join(message.get("body", b"") for message in sent[1:])
    # ors answers with a response (or its events); the floor passes the stub's answer on
    done = (b"event: response.completed" in answer if stream else b'"status":"completed"' in answer) \
        or b'"finish_reason":"stop"' in answer
    if not sent or sent[0].get("status") != 200 or not done:
        raise RuntimeError(f"an answer that did not complete: {sent[:1]} {answer[:300]!r}")


async def drive(target: str, fmt: str, upstream: str, requests: int, warm: int,
                between: Callable[[str], None] = lambda _: None) -> None:
    """Start ``target``'s app, send it ``warm`` requests, call ``between("zero")``, send
    ``requests`` more one at a time, call ``between("dump")``, and stop the app."""
    with tempfile.TemporaryDirectory(prefix="ors-instructions-") as data_dir:
        await _drive(_app(target, upstream, Path(data_dir)), target, fmt, requests, warm, between)


async def _drive(app: ASGIApp, target: str, fmt: str, requests: int, warm: int,
                 between: Callable[[str], None]) -> None:
    stream = fmt == "sse"
    body = json.dumps({"model": MODEL, "input": "Hi", "store": target == "stored", "stream": stream}).encode()
    state: dict[str, Any] = {}
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": state},
                                       inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the app did not start: {started}")
    try:
        for _ in range(warm):
            await _request(app, body, state, stream)
        between("zero")
        for _ in range(requests):
            await _request(app, body, state, stream)
        between("dump")
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await lifespan


def _callgrind_control(action: str) -> None:
    flag = {"zero": "-z", "dump": "-d"}[action]
    subprocess.run(["callgrind_control", flag, str(os.getpid())], check=True, capture_output=True)


def _child(argv: list[str]) -> None:
    target, fmt, upstream, requests, warm = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    import uvloop  # the loop uvicorn runs ors on

    if target != "floor":  # logging as ``ors serve`` sets it up: an access line per request
        from app import logs
        from app.config import Settings

        settings = Settings()
        logs.configure(settings.log_level, settings.log_format, queued=True)
    between = _callgrind_control if os.environ.get(UNDER_CALLGRIND) else (lambda _: None)
    uvloop.run(drive(target, fmt, upstream, requests, warm, between))


def dump_total(path: Path) -> int:
    """The instruction count of a callgrind dump (its ``summary:`` or ``totals:`` line)."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError(f"{path} holds no total")


def count(target: str, fmt: str, upstream: str, requests: int, warm: int, work: Path) -> float:
    """Instructions per request of ``target`` in ``fmt``: one child under callgrind."""
    prefix = work / f"{target}-{fmt}"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={prefix}.%p", sys.executable, "-m",
               "bench.instructions", "--child", target, fmt, upstream, str(requests), str(warm)]
    done = subprocess.run(command, capture_output=True, env={**os.environ, UNDER_CALLGRIND: "1"},
                          cwd=Path(__file__).resolve().parent.parent, check=False)
    dumps = sorted(work.glob(f"{target}-{fmt}.*.1"))  # the dump asked for; .<pid> is the rest
    if done.returncode != 0 or not dumps:
        raise RuntimeError(f"{target}/{fmt} under callgrind failed:\n{done.stderr.decode()[-3000:]}")
    return dump_total(dumps[0]) / requests


def measure(requests: int, warm: int, log: Callable[[str], None] = print, *,
            targets: Sequence[str] = TARGETS, formats: Sequence[str] = FORMATS) -> dict[str, dict[str, float]]:
    """Each of ``targets`` in each of ``formats`` counted, two children at a time, in
    front of one stub."""
    counts: dict[str, dict[str, float]] = {target: {} for target in targets}
    with tempfile.TemporaryDirectory(prefix="ors-instructions-") as scratch:
        work = Path(scratch)
        with StubProcess(free_port(), work / "stub.log") as stub:
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                jobs = {(target, fmt): pool.submit(count, target, fmt, stub.base_url, requests, warm, work)
                        for target in targets for fmt in formats}
                for (target, fmt), job in jobs.items():
                    counts[target][fmt] = job.result()
                    log(f"  {target}/{fmt}: {counts[target][fmt]:,.0f} instructions a request")
    return counts


def report(counts: dict[str, dict[str, float]], requests: int, warm: int) -> dict[str, Any]:
    """The counts, and ors's over the floor's where both were counted."""
    floor = counts.get("floor", {})
    ors = {target: {fmt: value for fmt, value in by_format.items() if fmt in floor}
           for target, by_format in counts.items() if target != "floor"}
    return {
        "requests": requests, "warm": warm, "instructions_per_request": counts,
        "over_floor": {target: {fmt: value / floor[fmt] for fmt, value in by_format.items()}
                       for target, by_format in ors.items()},
        "above_floor": {target: {fmt: value - floor[fmt] for fmt, value in by_format.items()}
                        for target, by_format in ors.items()},
    }


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        _child(argv[1:])
        return
    parser = argparse.ArgumentParser(prog="python -m bench instructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests counted per target and format")
    parser.add_argument("--warm", type=int, default=30, help="requests before counting starts")
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    arguments = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind (with callgrind_control) is not installed: nothing to count with")
    print(f"instructions per request, {arguments.requests} requests per target and format, under callgrind")
    counts = measure(arguments.requests, arguments.warm, targets=arguments.targets, formats=arguments.formats)
    result = report(counts, arguments.requests, arguments.warm)
    print(f"{'':10}" + "".join(f"{fmt:>14}{fmt + '/floor':>12}" for fmt in arguments.formats))
    for target, by_format in counts.items():
        ratios = result["over_floor"].get(target, {})
        print(f"{target:10}" + "".join(
            f"{by_format[fmt]:>14,.0f}" + (f"{ratios[fmt]:>11.2f}x" if fmt in ratios else f"{'':>12}")
            for fmt in arguments.formats))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"instructions-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"written: {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
