"""A real Codex session, recorded on the embedded model, then replayed turn by turn on ors
and on raw llama.cpp given the same prompts.

*Record*: the real server in this process (the default embedded model, a fresh data
directory, every request the model gets kept by a recording backend and every WebSocket
frame by a tap), and the pinned Codex CLI through ``ors codex`` in ``exec`` mode on a
new git repository: a task that needs a shell command and a file edit, then ``exec
resume --last`` with a second task. The session is capped (``--max-turns`` model turns,
``--minutes``; the first run gets all but two of the turns, and two thirds of the time
if it needs them): a small model may go on calling tools. The recording backend passes
no warm-up (``generate: false``) on: a warm-up changes no turn's prompt, and its
evaluation beside the first turn's would only slow the recording. What Codex sent stays
under ``bench/results/work/`` (never committed), with the recording (a pickle) that
``--replay`` reuses.

*Replay*: each model turn made stateless (:mod:`bench.codex_turns`), with temperature 0
and ``max_output_tokens`` what the turn produced when recorded (16 to 256); ``ors
serve`` as its own process on a fresh data directory (a cold prompt cache) gets each
turn's body over HTTP (SSE, ``store: false``), and raw llama.cpp (llama.cpp's own
server, the same binary, GGUF file and options as ors's, a fresh slot directory) gets
exactly the ``POST /completion`` body ors would send for the turn's recorded request
(``make_plan``, ``Vocabulary.prompt_tokens``, ``completion_body``). Both are up; each turn
goes to raw, then to ors, so the machine's drift falls on both.

Per turn: prompt tokens (equal on both sides, or a warning), cached prompt tokens (ors's
``usage.input_tokens_details.cached_tokens``, raw's ``timings.cache_n``), time to the
first output and to the end. *First output* is the first text, or the first sign of a
tool call: on ors the first ``response.output_text.delta``, ``…arguments.delta``,
``…input.delta`` or ``response.output_item.added`` of a call; on raw the first delta ors's
own output parser makes of llama-server's chunks (so both sides see text or a call when
that parser lets it out); raw's first token is reported too. A JSON report and a plot go to
``bench/results/codex-<time>.json`` and ``.png``.

Run: ``make bench`` (all benchmarks) or ``python -m bench codex [--model ID] [--max-turns N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from app.backends.base import GenerationRequest
from app.backends.llama_process import ServerOptions, find_binary
from app.backends.llama_server import LlamaServer
from app.backends.local_completion import CompletionReader, completion_body, make_plan
from app.backends.model_files import LOCAL_MODELS, ModelFiles
from app.backends.toolcalls import tool_call_parser
from app.backends.vocabulary import Vocabulary
from app.config import Settings
from app.main import create_app, default_backends
from bench.codex_turns import TERMINAL_TYPES, Turn, model_turns, output_budget
from bench.embedded import _ors_server
from bench.report_files import RESULTS, write_report
from tests.asgi_tap import Connection, Tap
from tests.live import LiveServer
from tests.recording import RecordingBackend

CODEX = Path(__file__).resolve().parents[1] / "node_modules" / ".bin" / "codex"
TASK = "Run `ls` and `cat notes.txt`, then append the line 'checked' to notes.txt."
RESUME_TASK = "Now show the last line of notes.txt with `tail -n 1 notes.txt`."
NOTES = "Things to check before the release:\n- the changelog\n- the version number\n"
CALL_EVENTS = ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta")
CALL_ITEMS = ("function_call", "custom_tool_call")


@dataclass(frozen=True)
class Recorded:
    """One model turn of the session: its stateless body and what the model got."""

    turn: Turn
    request: GenerationRequest


@dataclass
class Side:
    prompt: int = 0
    cached: int = 0
    first_output: float = 0.0
    total: float = 0.0
    output: int = 0
    first_token: float = 0.0
    status: str = ""


# ---------------------------------------------------------------- record


def _fresh(path: Path, models: Path) -> Path:
    """An empty data directory whose ``models`` are the shared assembled files."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    (path / "models").symlink_to(models.resolve(), target_is_directory=True)
    return path


def _repository(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "notes.txt").write_text(NOTES)
    return path


def _model_turns_done(log: list[Connection]) -> int:
    """Turns of the session the model answered so far (a warm-up reads no tokens)."""
    return sum(1 for connection in list(log) for event in connection.sent()
               if event.get("type") in TERMINAL_TYPES
               and int((event["response"].get("usage") or {}).get("input_tokens", 0)) > 0)


def _codex(url: str, data: Path, args: list[str], out: Path, *, enough: Callable[[], bool], deadline: float) -> str:
    """``ors codex -- ARGS`` until it exits, ``enough()`` or the deadline; how it ended."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("ORS_", "CODEX_"))}
    env |= {"ORS_DATA_DIR": str(data), "ORS_CODEX_BIN": str(CODEX)}
    with out.open("ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "app.cli", "codex", "--url", url, "--", *args],
                                   env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        while process.poll() is None:
            if enough() or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                return "stopped at the cap"
            time.sleep(0.5)
    return f"exited {process.returncode}"


def record(model: str, work: Path, models: Path, max_turns: int, minutes: float) -> list[Recorded]:
    """The capped session (see the module docstring), its model turns in order."""
    settings = Settings(default_model=model, data_dir=_fresh(work / "record-server", models))
    backend = RecordingBackend(default_backends(settings)[0])
    app = create_app(settings, backends=[backend])
    log: list[Connection] = []
    app.add_middleware(Tap, log=log)
    repo = _repository(work / "repo")
    home = work / "codex-data"
    shutil.rmtree(home, ignore_errors=True)
    out = work / "codex-output.log"
    out.unlink(missing_ok=True)
    sandbox = ["-s", "workspace-write", "-C", str(repo)]
    runs = [(["exec", *sandbox, TASK], max(1, max_turns - 2), minutes * 40),
            (["exec", *sandbox, "resume", "--last", RESUME_TASK], max_turns, minutes * 60)]
    kept: list[Recorded] = []
    server = LiveServer(app).start(timeout=600)
    started = time.monotonic()
    try:
        for args, cap, seconds in runs:
            if _model_turns_done(log) >= max_turns or time.monotonic() >= started + minutes * 60:
                break
            connections, requests = len(log), len(backend.requests)
            ended = _codex(server.url, home, args, out, enough=lambda cap=cap: _model_turns_done(log) >= cap,
                           deadline=started + seconds)
            kept += _paired(log[connections:], backend.requests[requests:])
            print(f"codex session: {args[-1]!r} {ended}; {len(kept)} model turn(s) so far, "
                  f"{time.monotonic() - started:.0f} s", flush=True)
    finally:
        server.stop()
    return kept[:max_turns]


def _paired(connections: list[Connection], requests: list[GenerationRequest]) -> list[Recorded]:
    """One run's answered turns with the requests the model got meanwhile, in order (a
    turn cut off when Codex was stopped comes last, unanswered, and is left out); those
    that completed, or ran out of tokens."""
    turns = model_turns(connections)
    if len(turns) > len(requests):
        print(f"warning: {len(turns)} answered turns but the model got {len(requests)} requests")
    return [Recorded(turn, request) for turn, request in zip(turns, requests, strict=False)
            if turn.status in ("completed", "incomplete")]


# ---------------------------------------------------------------- replay


async def _raw_turn(client: httpx.AsyncClient, vocabulary: Vocabulary, model: str, window: int,
                    request: GenerationRequest, budget: int) -> Side:
    """The recorded request as ors would send it, at temperature 0 and ``budget`` tokens."""
    spec = LOCAL_MODELS[model]
    request = replace(request, sampling=replace(request.sampling, temperature=0.0, max_output_tokens=budget))
    plan = make_plan(request, spec, vocabulary)
    tokens = vocabulary.prompt_tokens(plan.messages, plan.tools)
    body = completion_body(plan, tokens, min(plan.max_tokens or budget, window - len(tokens)))
    reader = CompletionReader(tool_call_parser(request, spec), plan)
    side = Side(prompt=len(tokens))
    started = time.perf_counter()
    async with client.stream("POST", "/completion", json={**body, "stream": True}) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("content") and not side.first_token:
                side.first_token = time.perf_counter() - started
            if reader.feed(chunk) and not side.first_output:
                side.first_output = time.perf_counter() - started
            if chunk.get("stop"):
                side.total = time.perf_counter() - started
                timings = chunk.get("timings") or {}
                side.cached = int(timings.get("cache_n", 0))
                side.output = int(timings.get("predicted_n", 0))
                side.status = str(chunk.get("stop_type"))
    return side


def _first_output(event: dict[str, Any]) -> bool:
    kind = event["type"]
    return (kind == "response.output_text.delta" or kind in CALL_EVENTS
            or (kind == "response.output_item.added" and event["item"].get("type") in CALL_ITEMS))


async def _ors_turn(client: httpx.AsyncClient, body: dict[str, Any]) -> Side:
    side = Side()
    started = time.perf_counter()
    async with client.stream("POST", "/v1/responses", json={**body, "stream": True, "store": False}) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"ors answered {reply.status_code}: {(await reply.aread())[:2000]!r}")
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if not side.first_output and _first_output(event):
                side.first_output = time.perf_counter() - started
            if event["type"] in TERMINAL_TYPES:
                side.total = time.perf_counter() - started
                response = event["response"]
                usage = response.get("usage") or {}
                side.prompt = int(usage.get("input_tokens", 0))
                side.cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens", 0))
                side.output = int(usage.get("output_tokens", 0))
                side.status = str(response.get("status"))
    return side


async def replay(model: str, work: Path, models: Path, recorded: list[Recorded]) -> list[dict[str, Any]]:
    """Each turn on raw llama.cpp, then on ors, both started cold; the per-turn figures."""
    settings = Settings(data_dir=_fresh(work / "replay-raw", models))
    spec = LOCAL_MODELS[model]
    path = ModelFiles(settings.data_dir).path(model)
    vocabulary = Vocabulary(spec, path)
    window = settings.model_context or spec.context_window
    options = ServerOptions(
        model_path=path, context=window, parallel=settings.model_parallel, threads=settings.model_threads,
        cache_ram_mib=settings.model_cache_ram_mib, slot_dir=work / "replay-raw" / "slots",
        kv_type=settings.model_kv_type, batch=settings.model_chunk,
    )
    raw = LlamaServer(find_binary(), options, work / "replay-raw" / "llama-server.log")
    await raw.start()
    ors = None
    rows = []
    try:
        ors = _ors_server(_fresh(work / "replay-ors", models), model)
        async with httpx.AsyncClient(base_url=raw.base_url, headers=raw.headers, timeout=None) as raw_client, \
                httpx.AsyncClient(base_url=ors.url, timeout=None) as ors_client:
            for number, one in enumerate(recorded, 1):
                budget = output_budget(one.turn.output_tokens)
                raw_side = await _raw_turn(raw_client, vocabulary, model, window, one.request, budget)
                ors_side = await _ors_turn(ors_client, {**one.turn.body, "temperature": 0,
                                                        "max_output_tokens": budget})
                row = {"turn": number, "recorded_output_tokens": one.turn.output_tokens, "budget": budget,
                       "raw": asdict(raw_side), "ors": asdict(ors_side)}
                rows.append(row)
                _print_row(row)
    finally:
        if ors is not None:
            ors.terminate()
        await raw.stop()
        vocabulary.close()
    return rows


# ---------------------------------------------------------------- report


HEADER = (f"{'turn':>4} {'prompt ors/raw':>15} {'cached ors/raw':>15} {'first output ors/raw (s)':>25} "
          f"{'ratio':>6} {'total ors/raw (s)':>19} {'ratio':>6} {'out ors/raw':>12} {'raw 1st token':>14}")


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def _print_row(row: dict[str, Any]) -> None:
    ors, raw = row["ors"], row["raw"]
    if ors["prompt"] != raw["prompt"]:
        print(f"warning: turn {row['turn']}: ors read {ors['prompt']} prompt tokens, raw {raw['prompt']}")
    print(f"{row['turn']:>4} {ors['prompt']:>7}/{raw['prompt']:<7} {ors['cached']:>7}/{raw['cached']:<7} "
          f"{ors['first_output']:>12.2f}/{raw['first_output']:<12.2f} "
          f"{_ratio(ors['first_output'], raw['first_output']):>6.2f} "
          f"{ors['total']:>9.2f}/{raw['total']:<9.2f} {_ratio(ors['total'], raw['total']):>6.2f} "
          f"{ors['output']:>5}/{raw['output']:<6} {raw['first_token']:>14.2f}", flush=True)


def totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The session's sums on each side: prompt and cached tokens, first-output and total
    seconds, output tokens."""
    return {side: {key: sum(row[side][key] for row in rows)
                   for key in ("prompt", "cached", "first_output", "total", "output")}
            for side in ("ors", "raw")}


def _report(model: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    summed = totals(rows)
    ors, raw = summed["ors"], summed["raw"]
    print(f"session: {len(rows)} turns; prompt tokens ors {ors['prompt']:.0f} / raw {raw['prompt']:.0f}, "
          f"cached ors {ors['cached']:.0f} / raw {raw['cached']:.0f}")
    print(f"session: first output ors {ors['first_output']:.1f} s / raw {raw['first_output']:.1f} s "
          f"({_ratio(ors['first_output'], raw['first_output']):.2f}), total ors {ors['total']:.1f} s / "
          f"raw {raw['total']:.1f} s ({_ratio(ors['total'], raw['total']):.2f})")
    return {"model": model, "turns": rows, "totals": summed}


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["turns"]
    turns = [row["turn"] for row in rows]
    figure, (tokens, first, total) = plt.subplots(1, 3, figsize=(15, 4))
    tokens.plot(turns, [row["raw"]["prompt"] for row in rows], "k-", label="prompt")
    tokens.plot(turns, [row["raw"]["cached"] for row in rows], "o--", label="cached, raw llama.cpp")
    tokens.plot(turns, [row["ors"]["cached"] for row in rows], "x:", label="cached, ors")
    tokens.set_title("prompt tokens")
    for axes, key, title in ((first, "first_output", "first output (s)"), (total, "total", "whole turn (s)")):
        axes.bar([t - 0.2 for t in turns], [row["raw"][key] for row in rows], 0.4, label="raw llama.cpp")
        axes.bar([t + 0.2 for t in turns], [row["ors"][key] for row in rows], 0.4, label="ors")
        axes.set_yscale("log")
        axes.set_title(title)
    for axes in (tokens, first, total):
        axes.set_xlabel("turn")
        axes.set_xticks(turns)
        axes.legend()
    figure.suptitle(f"a Codex session replayed: {report['model']}")
    figure.tight_layout()
    figure.savefig(path)


async def run(model: str, max_turns: int, minutes: float, replayed: Path | None) -> dict[str, Any]:
    work = RESULTS / "work" / "agent-session"
    work.mkdir(parents=True, exist_ok=True)
    models = RESULTS / "data" / "models"
    models.mkdir(parents=True, exist_ok=True)
    await asyncio.to_thread(ModelFiles(RESULTS / "data").path, model)  # assembled once, shared
    if replayed is None:
        if not os.access(CODEX, os.X_OK):
            sys.exit(f"{CODEX} is missing: `make node_modules/.bin/codex` installs the Codex of package.json")
        recorded = await asyncio.to_thread(record, model, work, models, max_turns, minutes)
        saved = work / "recording.pickle"
        saved.write_bytes(pickle.dumps(recorded))
        print(f"recorded {len(recorded)} model turn(s) into {saved}")
    else:
        recorded = pickle.loads(replayed.read_bytes())[:max_turns]  # noqa: S301 - our own file
    if not recorded:
        sys.exit("the session has no model turn to replay")
    print(f"\na Codex session replayed, {model}: ors vs raw llama.cpp, same binary, model file and prompts")
    print(HEADER)
    rows = await replay(model, work, models, recorded)
    report = _report(model, rows)
    write_report(RESULTS, "codex", report, lambda path: _plot(report, path))
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench codex")
    parser.add_argument("--model", default=Settings().default_model, choices=sorted(LOCAL_MODELS))
    parser.add_argument("--max-turns", type=int, default=6, help="model turns the session is capped at")
    parser.add_argument("--minutes", type=float, default=25, help="minutes the session is capped at")
    parser.add_argument("--replay", type=Path, help="replay this recording (bench/results/work/agent-session/"
                        "recording.pickle) instead of recording a session")
    arguments = parser.parse_args(argv)
    asyncio.run(run(arguments.model, arguments.max_turns, arguments.minutes, arguments.replay))
