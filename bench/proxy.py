"""The proxy overhead: ors in front of a fast upstream, against that upstream directly.

One run starts the stub upstream of :mod:`bench.stub` and ``ors serve`` (a real process,
its defaults, a fresh SQLite store, the stub as ``ORS_UPSTREAM_URL`` and its model as the
default model, so no embedded model is loaded) and the floor of :mod:`bench.floor` in
front of the same stub, then measures four targets over loopback with the same client
(httpx, :mod:`bench.proxy_load`, whose own cost cancels in the differences):

* ``direct``: the stub's ``POST /v1/chat/completions`` (``stream`` as the format asks);
* ``stored``: ors's ``POST /v1/responses``, ``store: true``;
* ``unstored``: the same with ``store: false``;
* ``floor``: a bare forwarder on ors's stack (uvicorn, ors's upstream client) with nothing of ors in
  it, a reference held to no target: what any proxy on this stack costs on the machine.

Each in two formats, ``json`` and ``sse``. The targets take turns in rounds, block after
block in alternating order, so drift of the machine falls on all of them alike:

* latency, one request at a time: p50/p99, time to first byte, to first text;
* throughput at concurrency 16 and 64 (one kept-alive connection per request in flight):
  requests per second, and the p99 under that load;
* CPU time of the serving process per request (ors for ors, the stub for ``direct``, the
  floor's process for ``floor``).

Then, through ors: 1,000 streams held open at once by the stub (``--streams``), and a
``previous_response_id`` chain of 1,000 turns (``--chain``). Last, ors on PostgreSQL
(a fresh database on ``--postgres``, skipped when it cannot be reached) with 1 and then 2
worker processes (``--workers``): throughput at concurrency 16 and 64 against the stub
directly, interleaved the same way. The figures are printed with
the targets they are held to, and written to ``bench/results/proxy-<time>.json`` and
``.png`` (see :mod:`bench.proxy_report`).

Run: ``make bench`` (all benchmarks), ``python -m bench proxy`` (a few minutes), or
``python -m bench proxy --quick`` (a smoke run of well under a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import proxy_report
from bench.floor import FloorProcess
from bench.procfs import children_named
from bench.proxy_load import CHAT_PROBE, RESPONSES_PROBE, Request, Samples, Target, block, chain, open_streams, post
from bench.stub import MODEL, StubProcess, hold_model
from tests.live import ServerProcess, free_port

FORMATS = ("json", "sse")
CONCURRENCIES = (16, 64)
WARM_UP = 30
"""Requests per target and format before anything is measured."""


@dataclass(frozen=True)
class Plan:
    """How much to measure. Counts are per target and format."""

    rounds: int = 10
    latency_requests: int = 1000
    throughput_requests: int = 640
    streams: int = 1000
    hold_s: float = 10.0
    chain_turns: int = 1000


QUICK = Plan(rounds=2, latency_requests=40, throughput_requests=128, streams=200, hold_s=3.0, chain_turns=100)


def _targets(stub_port: int, stub_pid: int, ors_port: int, ors_pid: int,
             floor: FloorProcess | None = None) -> list[Target]:
    def chat(stream: bool) -> Request:
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return post("/v1/chat/completions", body)

    def responses(store: bool, stream: bool) -> Request:
        return post("/v1/responses", {"model": MODEL, "input": "Hi", "store": store, "stream": stream})

    targets = [
        Target("direct", stub_port, stub_pid, {"json": chat(False), "sse": chat(True)}, CHAT_PROBE),
        Target("stored", ors_port, ors_pid, {"json": responses(True, False), "sse": responses(True, True)},
               RESPONSES_PROBE),
        Target("unstored", ors_port, ors_pid, {"json": responses(False, False), "sse": responses(False, True)},
               RESPONSES_PROBE),
    ]
    if floor is not None and floor.process is not None:
        def forwarded(stream: bool) -> Request:
            return post("/v1/responses", {"model": MODEL, "input": "Hi", "store": False, "stream": stream})

        # it passes the stub's chunks through: they are read as the stub's are
        targets.append(Target("floor", floor.port, floor.process.pid,
                              {"json": forwarded(False), "sse": forwarded(True)}, CHAT_PROBE))
    return targets


async def _interleaved(targets: list[Target], plan: Plan, concurrency: int, total: int) -> dict[str, Samples]:
    """``total`` requests per target and format at ``concurrency``, in ``plan.rounds``
    rounds (fewer if a block would hold less than twice the concurrency); in each round
    every target runs one block per format, in alternating order."""
    merged = {f"{fmt}/{target.name}": Samples() for fmt in FORMATS for target in targets}
    per_block = max(2 * concurrency, total // plan.rounds) if concurrency > 1 else max(1, total // plan.rounds)
    for number in range(max(1, total // per_block)):
        order = targets if number % 2 == 0 else targets[::-1]
        for fmt in FORMATS:
            for target in order:
                merged[f"{fmt}/{target.name}"].merge(await block(target, fmt, concurrency, per_block))
    return merged


async def measure(stub: StubProcess, ors: ServerProcess, plan: Plan, *, floor: FloorProcess | None = None,
                  log: Any = print) -> dict[str, Any]:
    """Every figure of one run, raw (see :func:`bench.proxy_report.summarize`)."""
    assert stub.process is not None and ors.process is not None
    targets = _targets(stub.port, stub.process.pid, ors.port, ors.process.pid, floor)
    await _warm_up(targets)
    phases: dict[str, dict[str, Samples]] = {}
    log(f"latency: {plan.latency_requests} requests one at a time per target and format")
    phases["c1"] = await _interleaved(targets, plan, 1, plan.latency_requests)
    for concurrency in CONCURRENCIES:
        log(f"throughput: {plan.throughput_requests} requests at concurrency {concurrency} per target and format")
        phases[f"c{concurrency}"] = await _interleaved(targets, plan, concurrency, plan.throughput_requests)
    streams = None
    if plan.streams:
        log(f"{plan.streams} streams through ors at once, each held {plan.hold_s:g} s by the upstream")
        streams = await open_streams(ors.port, ors.process.pid, hold_model(plan.hold_s), plan.streams, plan.hold_s)
    chained = None
    if plan.chain_turns:
        log(f"a previous_response_id chain of {plan.chain_turns} turns")
        chained = await chain(ors.port, MODEL, plan.chain_turns, direct_port=stub.port)
    return {"phases": phases, "streams": streams, "chain": chained}


def _raise_file_limit() -> int:
    """Lets this process (and the servers it starts, which inherit it) hold thousands of
    sockets: the soft limit on open files goes up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


POSTGRES_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
WORKER_COUNTS = (1, 2)


@contextlib.contextmanager
def _postgres_database(admin_url: str) -> Iterator[str | None]:
    """A fresh PostgreSQL database for one run (its SQLAlchemy URL), dropped after; ``None``
    when the server cannot be reached."""
    import uuid

    import asyncpg

    name = f"ors_bench_{uuid.uuid4().hex[:12]}"

    async def admin(statement: str) -> None:
        connection = await asyncpg.connect(admin_url, timeout=5)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    try:
        asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"workers: skipped, no PostgreSQL at {admin_url} ({exc})")
        yield None
        return
    host = admin_url.split("@", 1)[1].rsplit("/", 1)[0]
    user = admin_url.split("//", 1)[1].split("@", 1)[0]
    try:
        yield f"postgresql+asyncpg://{user}@{host}/{name}"
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def measure_workers(stub: StubProcess, plan: Plan, work: Path, runner: asyncio.Runner,
                    admin_url: str) -> dict[str, Any] | None:
    """Throughput of ors on PostgreSQL with each of :data:`WORKER_COUNTS` worker
    processes, against the stub directly in the same rounds; ``None`` without PostgreSQL."""
    assert stub.process is not None
    with _postgres_database(admin_url) as database:
        if database is None:
            return None
        runs: dict[str, Any] = {}
        for count in WORKER_COUNTS:
            print(f"workers: ors on PostgreSQL with {count} worker process(es)")
            ors = ServerProcess({"ORS_UPSTREAM_URL": stub.base_url, "ORS_DEFAULT_MODEL": MODEL,
                                 "ORS_DATABASE_URL": database, "ORS_WORKERS": str(count)}, work / f"ors-pg-{count}")
            ors.start()
            try:
                assert ors.process is not None
                targets = _targets(stub.port, stub.process.pid, ors.port, ors.process.pid)
                runner.run(_warm_up(targets))
                runs[str(count)] = {f"c{concurrency}": runner.run(_interleaved(targets, plan, concurrency,
                                                                               plan.throughput_requests))
                                    for concurrency in CONCURRENCIES}
            finally:
                try:
                    ors.terminate()
                except subprocess.TimeoutExpired:
                    ors.kill()
        return runs


async def _warm_up(targets: list[Target]) -> None:
    for target in targets:
        for fmt in FORMATS:
            await block(target, fmt, 1, WARM_UP)
            await block(target, fmt, 16, WARM_UP * 4)


@contextlib.contextmanager
def servers(work: Path) -> Iterator[tuple[StubProcess, ServerProcess, FloorProcess]]:
    """The stub, and ``ors serve`` and the floor in front of it, all on loopback, stopped on exit."""
    stub = StubProcess(free_port(), work / "stub.log").start()
    try:
        with FloorProcess(free_port(), stub.base_url, work / "floor.log") as floor:
            ors = ServerProcess({"ORS_UPSTREAM_URL": stub.base_url, "ORS_DEFAULT_MODEL": MODEL}, work / "ors").start()
            try:
                yield stub, ors, floor
            finally:
                try:
                    ors.terminate()
                except subprocess.TimeoutExpired:
                    ors.kill()
    finally:
        stub.stop()


def _loop_runner() -> asyncio.Runner:
    with contextlib.suppress(ImportError):
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    return asyncio.Runner()


def run(plan: Plan, *, quick: bool, postgres: str | None = POSTGRES_ADMIN) -> None:
    files = _raise_file_limit()
    if plan.streams and files < plan.streams * 3 + 100:
        print(f"warning: {files} open files allowed; {plan.streams} streams need about {plan.streams * 3}")
    load_before = os.getloadavg()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ors-proxy-bench-") as scratch:
        with servers(Path(scratch)) as (stub, ors, floor):
            assert ors.process is not None
            loaded = children_named(ors.process.pid, "llama-server")
            if loaded:
                print(f"warning: ors started {len(loaded)} llama-server process(es); their CPU is not counted")
            with _loop_runner() as runner:
                raw = runner.run(measure(stub, ors, plan, floor=floor))
                raw["workers"] = measure_workers(stub, plan, Path(scratch), runner, postgres) if postgres else None
        context = {"quick": quick, "plan": plan.__dict__, "cpus": os.cpu_count(), "load_before": load_before,
                   "load_after": os.getloadavg(), "seconds": time.perf_counter() - started,
                   "embedded_model_processes": len(loaded), "open_files_limit": files}
        stem = proxy_report.write(proxy_report.summarize(raw, context))
        shutil.copyfile(ors.log_path, stem.with_name(f"{stem.name}-ors.log"))
        print(f"ors's log: {stem.name}-ors.log")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few requests, 200 streams, 100 turns")
    parser.add_argument("--rounds", type=int, help="rounds the targets take turns in")
    parser.add_argument("--requests", type=int, help="requests one at a time, per target and format")
    parser.add_argument("--throughput-requests", type=int, help="requests per concurrency, target and format")
    parser.add_argument("--streams", type=int, help="streams held open at once through ors (0: skip)")
    parser.add_argument("--hold", type=float, help="seconds the upstream holds each of those streams")
    parser.add_argument("--chain", type=int, help="turns of the previous_response_id chain (0: skip)")
    parser.add_argument("--postgres", default=POSTGRES_ADMIN, metavar="URL",
                        help="PostgreSQL to create the workers run's database on (default: %(default)s)")
    parser.add_argument("--no-workers", action="store_true", help="skip the 1 vs 2 workers run on PostgreSQL")
    arguments = parser.parse_args(argv)
    plan = QUICK if arguments.quick else Plan()
    overrides = {"rounds": arguments.rounds, "latency_requests": arguments.requests,
                 "throughput_requests": arguments.throughput_requests, "streams": arguments.streams,
                 "hold_s": arguments.hold, "chain_turns": arguments.chain}
    plan = Plan(**{**plan.__dict__, **{key: value for key, value in overrides.items() if value is not None}})
    run(plan, quick=arguments.quick, postgres=None if arguments.no_workers else arguments.postgres)
