"""The embedded engine, side by side with raw llama.cpp, in one run.

*raw llama.cpp* is llama.cpp's own server, the same binary and GGUF file that ors runs,
with the same slots and context, driven directly with ``POST /completion`` and the exact
prompt tokens ors would send. *ors* is the real server on loopback, ``POST
/v1/responses`` streamed. Both are measured one after the other on the same machine.

Figures (printed, and written to ``bench/results/embedded-<time>.json`` and ``.png``):

* single-stream decode, tokens/s (client-side: from the first text to the end), and ors
  as a share of raw; both servers are up for it and are measured in alternating rounds
  (``--rounds``; the median of each side), so the machine's drift within a run does not
  land on one side; with the CPU time ors's own process spends per token;
* aggregate decode of 4 concurrent streams, and its ratio to one stream (the same
  rounds), with how far apart the four first tokens came and how much of the four
  prompts was found cached (each round sends the same four prompts again, so from the
  second round on each should be found whole);
* time to first token of a new conversation whose long instruction prefix (``--prefix``
  tokens, about what a coding agent sends) is: not cached (cold), cached by an earlier
  conversation, and cached before a restart of ors;
* the stall of a running stream while a new long prompt (``--stall-prompt`` tokens) is
  evaluated beside it: the longest gap between two of its tokens meanwhile, against its
  usual gap (the prompt is evaluated in chunks of ``--ubatch-size`` tokens interleaved
  with the running streams' decoding, so no gap should exceed about one chunk);
* the 17 acceptance tests all at once against ors (as the official harness runs them):
  the wall time and each test's time.

Run: ``make bench`` (all benchmarks) or ``python -m bench embedded [--model ID]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.backends.base import ChatMessage
from app.backends.llama_process import ServerOptions, find_binary
from app.backends.llama_server import LlamaServer
from app.backends.local import DEFAULT_PARALLEL
from app.backends.model_files import LOCAL_MODELS, ModelFiles
from app.backends.vocabulary import Vocabulary
from app.config import Settings
from bench.procfs import children_named, cpu_seconds, rss_mib
from bench.report_files import RESULTS, write_report
from tests.live import ServerProcess

QUESTION = "Write a very long essay about the history of Rome, at least 5000 words."
"""Long answers under greedy decoding, so every stream runs to its token budget."""


@dataclass
class Figures:
    model: str
    decode_tokens: int
    prefix_tokens: int
    stall_tokens: int = 0
    ubatch: int = 0
    raw: dict[str, Any] = field(default_factory=dict)
    ors: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Stream:
    first: float
    end: float
    tokens: int
    prompt: int = 0
    """Prompt tokens, and of them ``cached``: found in the KV cache, not evaluated."""
    cached: int = 0

    @property
    def rate(self) -> float:
        return (self.tokens - 1) / (self.end - self.first) if self.end > self.first and self.tokens > 1 else 0.0


def _aggregate(streams: list[Stream]) -> float:
    span = max(s.end for s in streams) - min(s.first for s in streams)
    return sum(s.tokens for s in streams) / span if span > 0 else 0.0


@dataclass
class Ticks:
    """When each piece of a running stream arrived; the stream stops when ``stop`` is set."""

    times: list[float] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def _stall(running: Any, arrive: Any, ticks: Ticks) -> dict[str, float]:
    """Start ``running`` (a stream that records its ``ticks``), wait for its tokens to
    flow, then run ``arrive`` (a new long prompt; its :class:`Stream`) beside it and stop
    the running stream once that has its first token. The running stream's longest gap
    between two tokens while the prompt was evaluated, and its median gap before."""
    task = asyncio.create_task(running)
    while len(ticks.times) < 9 and not task.done():
        await asyncio.sleep(0.05)
    began = time.perf_counter()
    arrived: Stream = await arrive
    evaluated = began + arrived.first
    ticks.stop.set()
    await task
    before = [b - a for a, b in zip(ticks.times, ticks.times[1:], strict=False) if b <= began]
    meanwhile = [b - a for a, b in zip(ticks.times, ticks.times[1:], strict=False) if b > began and a < evaluated]
    return {"stall_longest_gap_s": max(meanwhile, default=evaluated - began),
            "stall_usual_gap_s": sorted(before)[len(before) // 2] if before else 0.0,
            "stall_prompt_s": arrived.first}


def _instructions(vocabulary: Vocabulary, tokens: int) -> str:
    """Agent-like instructions of about ``tokens`` tokens, new each run (so the cold
    figure is cold), built from numbered rules."""
    rng = random.Random(time.time_ns())
    nouns = ["module", "test", "commit", "branch", "schema", "endpoint", "migration", "fixture", "config", "log"]
    verbs = ["run", "check", "lint", "format", "review", "document", "benchmark", "profile", "refactor", "pin"]
    lines = [f"Session {rng.getrandbits(64):x}. You are a coding agent working in a repository."]
    while True:
        number = len(lines)
        lines.append(f"Rule {number}: before you {rng.choice(verbs)} a {rng.choice(nouns)}, "
                     f"{rng.choice(verbs)} the {rng.choice(nouns)} and the {rng.choice(nouns)} it touches.")
        if number % 50 == 0:
            text = "\n".join(lines)
            if len(vocabulary.prompt_tokens((ChatMessage("system", text),), ())) >= tokens:
                return text


# ---------------------------------------------------------------- raw llama.cpp


async def _raw_stream(client: httpx.AsyncClient, prompt: list[int], n_predict: int, sampling: dict[str, Any],
                      ticks: Ticks | None = None) -> Stream:
    """One streamed completion with the sampling ors would send; retried once if a
    kept-alive connection was closed under it before anything arrived (as ors does)."""
    try:
        return await _raw_stream_once(client, prompt, n_predict, sampling, ticks)
    except httpx.RemoteProtocolError:
        if ticks is not None and ticks.times:
            raise  # it had begun: not a connection closed before the request
        return await _raw_stream_once(client, prompt, n_predict, sampling, ticks)


async def _raw_stream_once(client: httpx.AsyncClient, prompt: list[int], n_predict: int,
                           sampling: dict[str, Any], ticks: Ticks | None = None) -> Stream:
    started = time.perf_counter()
    first = end = 0.0
    tokens = cached = 0
    body = {"prompt": prompt, "n_predict": n_predict, "cache_prompt": True, "stream": True, **sampling,
            "temperature": 0.0}
    async with client.stream("POST", "/completion", json=body) as reply:
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("content") and not first:
                first = time.perf_counter()
            if ticks is not None and chunk.get("content"):
                ticks.times.append(time.perf_counter())
                if ticks.stop.is_set():
                    break
            if chunk.get("stop"):
                end = time.perf_counter()
                timings = chunk.get("timings", {})
                tokens = int(timings.get("predicted_n", 0))
                cached = int(timings.get("cache_n", 0))
    return Stream(first - started, end - started, tokens, len(prompt), cached)


def _raw_sampling(model: str) -> dict[str, Any]:
    spec = LOCAL_MODELS[model].sampling
    return {"top_p": spec.top_p, "top_k": spec.top_k, "min_p": spec.min_p, "repeat_penalty": spec.repeat_penalty}


async def _raw(figures: Figures, vocabulary: Vocabulary, server: LlamaServer, instructions: str,
               stall_prompt: str) -> None:
    """The prefix and stall figures on raw llama.cpp (already started); stops it."""
    try:
        async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers, timeout=None) as client:
            def prompt(*messages: ChatMessage) -> list[int]:
                return vocabulary.prompt_tokens(messages, ())

            sampling = _raw_sampling(figures.model)
            cold = await _raw_stream(client, prompt(ChatMessage("system", instructions),
                                                    ChatMessage("user", "What is rule 7?")), 8, sampling)
            warm = await _raw_stream(client, prompt(ChatMessage("system", instructions),
                                                    ChatMessage("user", "What is rule 12?")), 8, sampling)
            ticks = Ticks()
            stall = await _stall(
                _raw_stream(client, prompt(ChatMessage("user", QUESTION)), 100_000, sampling, ticks),
                _raw_stream(client, prompt(ChatMessage("system", stall_prompt), ChatMessage("user", "Rule 3?")),
                            1, sampling),
                ticks)
        assert server.process is not None
        rss = rss_mib(server.process.pid)
    finally:
        await server.stop()
    figures.raw.update(ttft_cold=cold.first, ttft_cached=warm.first, server_rss_mib=rss, **stall)


# ---------------------------------------------------------------- ors


async def _ors_stream(client: httpx.AsyncClient, body: dict[str, Any], ticks: Ticks | None = None) -> Stream:
    started = time.perf_counter()
    first = end = 0.0
    tokens = prompt = cached = 0
    async with client.stream("POST", "/v1/responses", json={**body, "stream": True, "store": False}) as reply:
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.output_text.delta" and not first:
                first = time.perf_counter()
            if ticks is not None and event["type"] == "response.output_text.delta":
                ticks.times.append(time.perf_counter())
                if ticks.stop.is_set():
                    break
            if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
                end = time.perf_counter()
                usage = event["response"].get("usage") or {}
                tokens = int(usage.get("output_tokens", 0))
                prompt = int(usage.get("input_tokens", 0))
                cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens", 0))
    return Stream(first - started, end - started, tokens, prompt, cached)


def _ors_server(data_dir: Path, model: str) -> ServerProcess:
    """``ors serve`` as its own process, as deployed (the client here does not share its
    interpreter)."""
    env = {"ORS_DEFAULT_MODEL": model, "ORS_MODEL_PARALLEL": str(DEFAULT_PARALLEL), "ORS_LOG_LEVEL": "warning"}
    return ServerProcess(env, data_dir).start(timeout=600)


async def _ors(figures: Figures, server: ServerProcess, instructions: str, stall_prompt: str,
               data_dir: Path) -> None:
    """The prefix, restart, stall and suite figures on ors (already started)."""
    model = figures.model
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=None) as client:
            ask = {"model": model, "instructions": instructions, "temperature": 0, "max_output_tokens": 16}
            cold = await _ors_stream(client, {**ask, "input": "What is rule 7?"})
            warm = await _ors_stream(client, {**ask, "input": "What is rule 12?", "prompt_cache_key": "agent"})
        assert server.process is not None
        rss = sum(rss_mib(pid) for pid in children_named(server.process.pid, "llama-server"))
    finally:
        server.terminate()  # a graceful stop: saves the slots' prompt caches
    restarted_at = time.perf_counter()
    server = _ors_server(data_dir, model)
    restart_seconds = time.perf_counter() - restarted_at
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=None) as client:
            again = await _ors_stream(client, {**ask, "input": "What is rule 20?", "prompt_cache_key": "agent"})
            # last: the new prompt may push the cached prefix out of a small window
            ticks = Ticks()
            stall = await _stall(
                _ors_stream(client, {"model": model, "input": QUESTION, "temperature": 0}, ticks),
                _ors_stream(client, {"model": model, "instructions": stall_prompt, "input": "Rule 3?",
                                     "temperature": 0, "max_output_tokens": 16}),
                ticks)
        suite = await asyncio.to_thread(_acceptance_at_once, f"{server.url}/v1", model)
    finally:
        server.terminate()
    figures.ors.update(ttft_cold=cold.first, ttft_cached=warm.first, ttft_after_restart=again.first,
                       restart_seconds=restart_seconds, server_rss_mib=rss,
                       **stall, **suite)


# ---------------------------------------------------------------- decode, side by side


async def _decode(figures: Figures, vocabulary: Vocabulary, raw: LlamaServer, ors: ServerProcess,
                  rounds: int) -> None:
    """Single-stream and 4-stream decode on both servers, in alternating rounds (raw then
    ors, then ors then raw, ...); each figure is the median of its rounds. Only one
    server works at a time; the other's model sits idle in memory. ors's own CPU time
    (its process, not llama-server's) is read around its single streams."""
    model = figures.model
    sampling = _raw_sampling(model)
    assert ors.process is not None
    ors_pid = ors.process.pid

    def tokens(question: str) -> list[int]:
        return vocabulary.prompt_tokens((ChatMessage("user", question),), ())

    def ask(question: str) -> dict[str, Any]:
        return {"model": model, "input": question, "temperature": 0, "max_output_tokens": figures.decode_tokens}

    singles: dict[str, list[float]] = {"raw": [], "ors": []}
    batches: dict[str, list[float]] = {"raw": [], "ors": []}
    spreads: dict[str, list[float]] = {"raw": [], "ors": []}
    reuse: dict[str, list[float]] = {"raw": [], "ors": []}

    def four(side: str, many: list[Stream]) -> None:
        batches[side].append(_aggregate(many))
        spreads[side].append(max(s.first for s in many) - min(s.first for s in many))
        reuse[side].append(sum(s.cached for s in many) / max(sum(s.prompt for s in many), 1))
    ors_cpu_per_token: list[float] = []
    async with httpx.AsyncClient(base_url=raw.base_url, headers=raw.headers, timeout=None) as raw_client, \
            httpx.AsyncClient(base_url=ors.url, timeout=None) as ors_client:
        await _raw_stream(raw_client, tokens("Hi"), 4, sampling)  # warm-ups
        await _ors_stream(ors_client, {"model": model, "input": "Hi", "max_output_tokens": 16})

        async def raw_round() -> None:
            one = await _raw_stream(raw_client, tokens(QUESTION), figures.decode_tokens, sampling)
            many = await asyncio.gather(*[
                _raw_stream(raw_client, tokens(f"{QUESTION} ({k})"), figures.decode_tokens, sampling)
                for k in range(DEFAULT_PARALLEL)
            ])
            singles["raw"].append(one.rate)
            four("raw", many)

        async def ors_round() -> None:
            before = cpu_seconds(ors_pid)
            one = await _ors_stream(ors_client, ask(QUESTION))
            ors_cpu_per_token.append((cpu_seconds(ors_pid) - before) / max(one.tokens, 1))
            many = await asyncio.gather(*[_ors_stream(ors_client, ask(f"{QUESTION} ({k})"))
                                          for k in range(DEFAULT_PARALLEL)])
            singles["ors"].append(one.rate)
            four("ors", many)

        for number in range(rounds):
            first, second = (raw_round, ors_round) if number % 2 == 0 else (ors_round, raw_round)
            await first()
            await second()
    for side, into in (("raw", figures.raw), ("ors", figures.ors)):
        into.update(decode_1=statistics.median(singles[side]), decode_4=statistics.median(batches[side]),
                    decode_1_rounds=singles[side], decode_4_rounds=batches[side],
                    decode_4_first_spread_rounds=spreads[side], decode_4_cached_rounds=reuse[side])
    figures.ors["cpu_ms_per_token"] = 1000 * statistics.median(ors_cpu_per_token)


def _acceptance_at_once(base_url: str, model: str) -> dict[str, float]:
    """The 17 acceptance tests all at once (as the official harness runs them): the wall
    time, how many passed, and each test's seconds."""
    from compliance import http_checks, ws_checks  # noqa: F401 - registers the checks
    from compliance.suite import SuiteConfig, run_concurrently, select

    started = time.perf_counter()
    outcomes = list(run_concurrently(SuiteConfig(base_url=base_url, model=model), select()))
    for outcome in outcomes:
        if outcome.status != "PASS":
            print(f"acceptance: {outcome.line()}")
    figures = {"suite_wall_s": time.perf_counter() - started,
               "suite_passed": float(sum(outcome.status == "PASS" for outcome in outcomes)),
               "suite_total": float(len(outcomes))}
    figures.update({f"suite_s.{outcome.name}": outcome.seconds for outcome in outcomes})
    return figures


# ---------------------------------------------------------------- report


def _rounds(label: str, raw: list[float], ors: list[float], spelled: str) -> None:
    """One figure's rounds on both servers, on a line of their own."""
    print(f"{label:34}raw {' '.join(spelled.format(r) for r in raw)}   ors {' '.join(spelled.format(r) for r in ors)}")


def _report(figures: Figures) -> dict[str, Any]:
    raw, ors = figures.raw, figures.ors
    ratios = {
        "single_decode_share_of_raw": ors["decode_1"] / raw["decode_1"],
        "ors_4_streams_over_1": ors["decode_4"] / ors["decode_1"],
        "raw_4_streams_over_1": raw["decode_4"] / raw["decode_1"],
    }
    print(f"\nembedded engine, {figures.model}: raw llama.cpp vs ors, same binary and model file")
    print(f"{'':34}{'raw llama.cpp':>15}{'ors':>12}")
    print(f"{'decode, 1 stream (tokens/s)':34}{raw['decode_1']:15.1f}{ors['decode_1']:12.1f}"
          f"   ors/raw {ratios['single_decode_share_of_raw']:.1%}  (target >= 95%)")
    _rounds("  each round (tokens/s)", raw["decode_1_rounds"], ors["decode_1_rounds"], "{:.1f}")
    print(f"{'  ors process CPU per token (ms)':34}{'':>15}{ors['cpu_ms_per_token']:12.2f}")
    print(f"{'decode, 4 streams (tokens/s)':34}{raw['decode_4']:15.1f}{ors['decode_4']:12.1f}"
          f"   4/1: raw {ratios['raw_4_streams_over_1']:.2f}x, ors {ratios['ors_4_streams_over_1']:.2f}x"
          "  (target >= 2.5x)")
    _rounds("  each round (tokens/s)", raw["decode_4_rounds"], ors["decode_4_rounds"], "{:.1f}")
    _rounds("  first tokens apart (s)", raw["decode_4_first_spread_rounds"], ors["decode_4_first_spread_rounds"],
            "{:.2f}")
    _rounds("  prompt tokens found cached", raw["decode_4_cached_rounds"], ors["decode_4_cached_rounds"], "{:.0%}")
    print(f"{f'first token, {figures.prefix_tokens}-token prefix cold (s)':34}"
          f"{raw['ttft_cold']:15.2f}{ors['ttft_cold']:12.2f}")
    print(f"{'first token, prefix cached (s)':34}{raw['ttft_cached']:15.2f}{ors['ttft_cached']:12.2f}"
          "   (target <= 10 s)")
    print(f"{'first token, cached, after restart (s)':34}{'':>15}{ors['ttft_after_restart']:12.2f}"
          f"   (target <= 15 s; restart took {ors['restart_seconds']:.1f} s)")
    print(f"{'a stream, usual gap between tokens (s)':34}{raw['stall_usual_gap_s']:15.2f}"
          f"{ors['stall_usual_gap_s']:12.2f}")
    print(f"{f'its longest gap, {figures.stall_tokens}-token prompt beside (s)':34}"
          f"{raw['stall_longest_gap_s']:15.2f}{ors['stall_longest_gap_s']:12.2f}"
          f"   (the prompt took {raw['stall_prompt_s']:.1f} s / {ors['stall_prompt_s']:.1f} s, "
          f"in chunks of {figures.ubatch} tokens)")
    print(f"{'llama-server RSS, after the prefix (MiB)':34}{raw['server_rss_mib']:15.0f}{ors['server_rss_mib']:12.0f}")
    print(f"acceptance suite, all {ors['suite_total']:.0f} at once on ors: {ors['suite_passed']:.0f} passed, "
          f"wall {ors['suite_wall_s']:.1f} s")
    for key in sorted(key for key in ors if key.startswith("suite_s.")):
        print(f"    {key.removeprefix('suite_s.'):44}{ors[key]:7.1f} s")
    return {**asdict(figures), "ratios": ratios}


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    raw, ors = report["raw"], report["ors"]
    figure, (decode, ttft) = plt.subplots(1, 2, figsize=(11, 4))
    labels = ["1 stream", "4 streams"]
    xs = range(len(labels))
    decode.bar([x - 0.2 for x in xs], [raw["decode_1"], raw["decode_4"]], 0.4, label="raw llama.cpp")
    decode.bar([x + 0.2 for x in xs], [ors["decode_1"], ors["decode_4"]], 0.4, label="ors")
    decode.set_xticks(list(xs), labels)
    decode.set_ylabel("tokens/s")
    decode.set_title("decode")
    decode.legend()
    stages = ["cold", "cached", "after restart"]
    ttft.bar([x - 0.2 for x in range(2)], [raw["ttft_cold"], raw["ttft_cached"]], 0.4, label="raw llama.cpp")
    ttft.bar([x + 0.2 for x in range(3)], [ors["ttft_cold"], ors["ttft_cached"], ors["ttft_after_restart"]], 0.4,
             label="ors")
    ttft.set_xticks(range(3), stages)
    ttft.set_ylabel("seconds")
    ttft.set_title(f"first token, {report['prefix_tokens']}-token prefix")
    ttft.legend()
    figure.suptitle(f"embedded engine: {report['model']}")
    figure.tight_layout()
    figure.savefig(path)


async def run(model: str, prefix_tokens: int, decode_tokens: int, stall_tokens: int,
              rounds: int = 5) -> dict[str, Any]:
    RESULTS.mkdir(exist_ok=True)
    data_dir = RESULTS / "data"
    work = RESULTS / "work"
    work.mkdir(parents=True, exist_ok=True)
    spec = LOCAL_MODELS[model]
    path = ModelFiles(data_dir).path(model)
    vocabulary = Vocabulary(spec, path)
    settings = Settings(data_dir=data_dir)
    options = ServerOptions(
        model_path=path, context=settings.model_context or spec.context_window, parallel=settings.model_parallel,
        threads=settings.model_threads, cache_ram_mib=settings.model_cache_ram_mib, slot_dir=work / "raw-slots",
        kv_type=settings.model_kv_type, batch=settings.model_chunk,
    )
    figures = Figures(model=model, decode_tokens=decode_tokens, prefix_tokens=prefix_tokens,
                      stall_tokens=stall_tokens, ubatch=options.batch)
    raw = LlamaServer(find_binary(), options, work / "raw-llama-server.log")
    await raw.start()
    try:
        ors = _ors_server(data_dir, model)
    except BaseException:
        await raw.stop()
        raise
    try:
        await _decode(figures, vocabulary, raw, ors, rounds)
    except BaseException:
        ors.terminate()
        await raw.stop()
        raise
    instructions, stall_prompt = _instructions(vocabulary, prefix_tokens), _instructions(vocabulary, stall_tokens)
    try:
        await _raw(figures, vocabulary, raw, instructions, stall_prompt)
    except BaseException:
        ors.terminate()
        raise
    await _ors(figures, ors, instructions, stall_prompt, data_dir)
    vocabulary.close()
    report = _report(figures)
    write_report(RESULTS, "embedded", report, lambda path: _plot(report, path))
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench embedded")
    parser.add_argument("--model", default=Settings().default_model, choices=sorted(LOCAL_MODELS))
    parser.add_argument("--prefix", type=int, default=6000, help="tokens of the shared instruction prefix")
    parser.add_argument("--decode", type=int, default=128, help="tokens per decode stream")
    parser.add_argument("--rounds", type=int, default=5, help="alternating decode rounds on each server")
    parser.add_argument("--stall-prompt", type=int, default=1536,
                        help="tokens of the new prompt evaluated beside a running stream")
    arguments = parser.parse_args(argv)
    asyncio.run(run(arguments.model, arguments.prefix, arguments.decode, arguments.stall_prompt,
                    arguments.rounds))
