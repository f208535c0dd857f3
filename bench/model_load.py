"""How long each embedded model takes to load, in ors and in raw llama.cpp, in one run.

Each model is measured as a user meets it:

* *raw llama.cpp*: llama.cpp's own server started on the model's file with the options
  ors gives it (window, slots, KV type, chunk; Jinja chat mode for a model whose chats
  llama.cpp reads), from the spawn to its first healthy answer;
* *ors load*: ``POST /v1/models/{id}/load`` on the real server, the model unloaded before
  (its file checked, vocabulary read, memory budget taken, llama-server started, saved
  prompt caches restored), until the answer;
* *ors on demand*: a streamed ``POST /v1/responses`` for the unloaded model: when its first
  event (``response.created``) arrives, and its first output text.

The models: the two built-in ones, the same files served from a models folder under new
ids (``ORS_MODELS_DIR``, read by ors's own chat format), and Qwen's file as a
``[models.ID]`` entry whose chats llama.cpp reads (``chat_parser = "llama.cpp"``). Raw and
ors alternate over ``--rounds`` (the median of each), so the machine's drift does not land
on one side. Printed, and written to ``bench/results/model-load-<time>.json`` and ``.png``.

Run: ``make bench`` (all benchmarks) or ``python -m bench model-load [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.backends.llama_process import ServerOptions, find_binary
from app.backends.llama_server import LlamaServer
from app.backends.model_files import LOCAL_MODELS, ModelFiles
from app.config import Settings
from bench.report_files import RESULTS, write_report
from tests.live import ServerProcess

QWEN, SMOLLM = "qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct"


@dataclass(frozen=True)
class Served:
    """One model as ors serves it: its id, the file, and whether llama.cpp reads its chats."""

    id: str
    how: str
    path: Path
    chat: bool = False


def _models(data_dir: Path, folder: Path) -> list[Served]:
    files = ModelFiles(data_dir)
    qwen, smollm = files.path(QWEN), files.path(SMOLLM)
    folder.mkdir(parents=True, exist_ok=True)
    for stem, path in (("qwen-folder", qwen), ("smollm2-folder", smollm)):
        link = folder / f"{stem}.gguf"
        link.unlink(missing_ok=True)
        link.symlink_to(path)
    return [
        Served(QWEN, "built-in", qwen), Served(SMOLLM, "built-in", smollm),
        Served("qwen-folder", "models folder", qwen), Served("smollm2-folder", "models folder", smollm),
        Served("qwen-jinja", "config entry, llama.cpp chat", qwen, chat=True),
    ]


def _config(path: Path, qwen: Path) -> Path:
    path.write_text(f'[models.qwen-jinja]\npath = {json.dumps(str(qwen))}\nchat_parser = "llama.cpp"\n')
    return path


async def _raw_start(model: Served, settings: Settings, work: Path) -> float:
    spec_window = LOCAL_MODELS[QWEN if "qwen" in model.id else SMOLLM].context_window
    options = ServerOptions(
        model_path=model.path, context=settings.model_context or spec_window, parallel=settings.model_parallel,
        threads=settings.model_threads, cache_ram_mib=settings.model_cache_ram_mib, slot_dir=work / "raw-slots",
        kv_type=settings.model_kv_type, batch=settings.model_chunk, chat=model.chat,
    )
    server = LlamaServer(find_binary(), options, work / f"raw-{model.id}.log")
    started = time.perf_counter()
    await server.start()
    took = time.perf_counter() - started
    await server.stop()
    return took


async def _unload(client: httpx.AsyncClient, model: str) -> None:
    """Unload ``model``; a request that has just ended may hold it a moment longer (409)."""
    for _ in range(100):
        answer = await client.post(f"/v1/models/{model}/unload")
        if answer.status_code != 409:
            break
        await asyncio.sleep(0.1)
    answer.raise_for_status()


async def _ors_load(client: httpx.AsyncClient, model: str) -> float:
    await _unload(client, model)
    started = time.perf_counter()
    answer = await client.post(f"/v1/models/{model}/load")
    took = time.perf_counter() - started
    answer.raise_for_status()
    return took


async def _ors_on_demand(client: httpx.AsyncClient, model: str) -> tuple[float, float]:
    """Seconds to the first event and to the first output text of a stream for the
    unloaded ``model``."""
    await _unload(client, model)
    body = {"model": model, "input": "Say hello.", "stream": True, "max_output_tokens": 16, "store": False}
    started = time.perf_counter()
    first_event = first_text = 0.0
    async with client.stream("POST", "/v1/responses", json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter() - started
            kind = json.loads(line[6:])["type"]
            first_event = first_event or now
            if kind == "response.output_text.delta" and not first_text:
                first_text = now
    return first_event, first_text


async def run(rounds: int) -> dict[str, Any]:
    data_dir, work = RESULTS / "data", RESULTS / "work" / "model-load"
    work.mkdir(parents=True, exist_ok=True)
    settings = Settings(data_dir=data_dir)
    models = _models(data_dir, work / "models")
    env = {"ORS_MODELS_DIR": str(work / "models"), "ORS_CONFIG": str(_config(work / "ors.toml", models[0].path)),
           "ORS_LOG_LEVEL": "warning"}
    ors = ServerProcess(env, data_dir).start(timeout=600)
    figures: dict[str, dict[str, list[float]]] = {m.id: {"raw": [], "load": [], "event": [], "text": []}
                                                  for m in models}
    try:
        async with httpx.AsyncClient(base_url=ors.url, timeout=600) as client:
            for round_number in range(rounds):
                for model in models:
                    seen = figures[model.id]
                    seen["raw"].append(await _raw_start(model, settings, work))
                    seen["load"].append(await _ors_load(client, model.id))
                    event, text = await _ors_on_demand(client, model.id)
                    seen["event"].append(event)
                    seen["text"].append(text)
                    await _unload(client, model.id)
                print(f"round {round_number + 1}/{rounds} done")
    finally:
        ors.terminate()
    report = _report(models, figures, rounds)
    write_report(RESULTS, "model-load", report, lambda path: _plot(report, path))
    return report


def _report(models: list[Served], figures: dict[str, dict[str, list[float]]], rounds: int) -> dict[str, Any]:
    rows = []
    print(f"\nmodel load, median of {rounds} rounds (seconds)")
    print(f"{'model':<30} {'served as':<30} {'raw':>6} {'load':>6} {'ratio':>6} {'event':>6} {'text':>6}")
    for model in models:
        seen = {name: statistics.median(values) for name, values in figures[model.id].items()}
        ratio = seen["load"] / seen["raw"]
        rows.append({"model": model.id, "served_as": model.how, "raw_start_s": seen["raw"], "ors_load_s": seen["load"],
                     "load_ratio": ratio, "on_demand_first_event_s": seen["event"],
                     "on_demand_first_text_s": seen["text"], "rounds": figures[model.id]})
        print(f"{model.id:<30} {model.how:<30} {seen['raw']:6.2f} {seen['load']:6.2f} {ratio:6.2f} "
              f"{seen['event']:6.2f} {seen['text']:6.2f}")
    return {"benchmark": "model-load", "rounds": rounds, "models": rows}


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["models"]
    xs = range(len(rows))
    figure, axes = plt.subplots(figsize=(11, 4))
    for offset, key, label in ((-0.3, "raw_start_s", "raw llama.cpp start"), (-0.1, "ors_load_s", "ors load"),
                               (0.1, "on_demand_first_event_s", "on demand: first event"),
                               (0.3, "on_demand_first_text_s", "on demand: first text")):
        axes.bar([x + offset for x in xs], [row[key] for row in rows], 0.2, label=label)
    axes.set_xticks(list(xs), [row["model"] for row in rows], rotation=10)
    axes.set_ylabel("seconds")
    axes.set_title(f"model load, median of {report['rounds']} rounds")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench model-load")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each measure")
    arguments = parser.parse_args(argv)
    asyncio.run(run(arguments.rounds))
