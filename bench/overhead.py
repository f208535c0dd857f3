"""Server overhead, measured through the real server on loopback.

* ``engine``: events per second and per-event cost of the whole path (builder, one
  serialization per event, SSE framing, HTTP) with the scripted backend, which costs
  nothing itself, so what is measured is the server.
* ``first event``: time from request to the first SSE byte, and to ``response.created``.
* ``store``: the cost of a stored continuation at depth 2 and depth 200.

Run: ``make bench`` (all benchmarks) or ``python -m bench overhead``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import httpx

from app.backends.base import Finish, TextDelta, Usage
from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.main import create_app
from tests.live import LiveServer

TOKENS = 2000


def _server(data_dir: Path) -> LiveServer:
    scripted = ScriptedBackend(
        {"bench-long": [*[TextDelta(" word") for _ in range(TOKENS)], Finish("stop", Usage(5, TOKENS))],
         "bench-short": [TextDelta("ok"), Finish("stop", Usage(5, 1))]}
    )
    return LiveServer(create_app(Settings(data_dir=data_dir), backends=[scripted])).start()


def bench_stream(client: httpx.Client, *, store: bool) -> None:
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        events = 0
        with client.stream("POST", "/v1/responses",
                           json={"model": "bench-long", "input": "x", "stream": True, "store": store}) as reply:
            for line in reply.iter_lines():
                if line.startswith("event:"):
                    events += 1
        runs.append((time.perf_counter() - started, events))
    seconds = statistics.median(run[0] for run in runs)
    events = runs[0][1]
    print(f"stream, store={store!s:5}: {events} events in {seconds * 1000:.0f} ms "
          f"-> {events / seconds:,.0f} events/s, {seconds / events * 1e6:.1f} us per event")


def bench_first_event(client: httpx.Client) -> None:
    firsts = []
    for _ in range(30):
        started = time.perf_counter()
        with client.stream("POST", "/v1/responses",
                           json={"model": "bench-short", "input": "x", "stream": True, "store": False}) as reply:
            first = True
            for _ in reply.iter_raw():
                if first:
                    firsts.append(time.perf_counter() - started)
                    first = False
    firsts.sort()
    print(f"first byte of a stream: p50 {firsts[len(firsts) // 2] * 1000:.2f} ms, "
          f"p90 {firsts[int(len(firsts) * 0.9)] * 1000:.2f} ms")


def bench_chain(client: httpx.Client) -> None:
    previous = None
    timings = []
    for _ in range(200):
        body = {"model": "bench-short", "input": "next", **({"previous_response_id": previous} if previous else {})}
        started = time.perf_counter()
        reply = client.post("/v1/responses", json=body)
        timings.append(time.perf_counter() - started)
        previous = reply.json()["id"]
    early, late = statistics.median(timings[1:11]), statistics.median(timings[-10:])
    print(f"stored continuation (request to JSON response): turn 2-11 {early * 1000:.1f} ms, "
          f"turn 191-200 {late * 1000:.1f} ms")


def main(argv: list[str] | None = None) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        server = _server(Path(data_dir))
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                bench_stream(client, store=False)
                bench_stream(client, store=True)
                bench_first_event(client)
                bench_chain(client)
        finally:
            server.stop()

