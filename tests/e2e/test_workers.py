"""``ors serve --workers N``: several worker processes on one port, sharing the real
PostgreSQL, in front of the benchmark's stub upstream (a real process on loopback).
Every request opens a new connection, so the kernel hands requests to either worker: a
response made by one is retrieved, continued and cancelled through the other. SQLite,
and a configuration with nothing but embedded models, are refused with a clear error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.stub import MODEL, StubProcess, hold_model
from compliance import check_response
from tests.live import ServerProcess, free_port


def _refusal(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "app.cli", "serve", "--workers", "2", "--port", str(free_port())]
    return subprocess.run(command, env={**os.environ, "ORS_DATA_DIR": str(tmp_path), **env},
                          capture_output=True, text=True, timeout=120)


def test_sqlite_keeps_one_writing_process(tmp_path: Path) -> None:
    result = _refusal(tmp_path, ORS_UPSTREAM_URL="http://127.0.0.1:9/v1")
    assert result.returncode == 2
    assert "needs PostgreSQL" in result.stderr and "SQLite keeps one writing process" in result.stderr


def test_workers_serve_upstream_models_only(tmp_path: Path, postgres_url: str) -> None:
    result = _refusal(tmp_path, ORS_DATABASE_URL=postgres_url)
    assert result.returncode == 2 and "serves upstream models only" in result.stderr


def test_workers_that_cannot_reach_the_database_end_the_server_with_a_failure(tmp_path: Path) -> None:
    """uvicorn's supervisor stops when a worker cannot start, and used to end with 0: a
    restart policy or systemd saw a clean exit. It is 3, as with one process."""
    closed = free_port()  # nothing listens there
    result = _refusal(tmp_path, ORS_DATABASE_URL=f"postgresql+asyncpg://postgres@127.0.0.1:{closed}/test",
                      ORS_DATABASE_WAIT_SECONDS="0", ORS_UPSTREAM_URL="http://127.0.0.1:9/v1", ORS_DEFAULT_MODEL="m")
    assert result.returncode == 3, result.stderr[-3000:]
    assert "The database could not be reached" in result.stderr


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StubProcess]:
    with StubProcess(free_port(), tmp_path_factory.mktemp("stub") / "stub.log") as running:
        yield running


@pytest.fixture(scope="module")
def workers(stub: StubProcess, postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess({"ORS_WORKERS": "2", "ORS_DATABASE_URL": postgres_url, "ORS_UPSTREAM_URL": stub.base_url,
                            "ORS_DEFAULT_MODEL": MODEL}, tmp_path_factory.mktemp("workers"))
    server.start()
    try:
        yield server
    finally:
        assert server.terminate() == 0, server.log()


def _worker_pids(parent: int) -> list[int]:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(pid) for pid in children
            if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")]


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _post(server: ServerProcess, body: dict[str, object]) -> dict[str, object]:
    reply = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)  # a new connection each time
    assert reply.status_code == 200, reply.text
    return check_response(reply.json())


def test_two_workers_share_the_requests(workers: ServerProcess) -> None:
    assert workers.process is not None
    pids = _worker_pids(workers.process.pid)
    assert len(pids) == 2
    before = {pid: _cpu_ticks(pid) for pid in pids}
    for _ in range(150):
        assert _post(workers, {"model": MODEL, "input": "hi", "store": False})["status"] == "completed"
    assert all(_cpu_ticks(pid) > before[pid] for pid in pids), "one worker served nothing"


def test_a_response_is_retrieved_and_continued_through_any_worker(workers: ServerProcess) -> None:
    for _ in range(8):
        first = _post(workers, {"model": MODEL, "input": "Remember: 7."})
        again = httpx.get(f"{workers.url}/v1/responses/{first['id']}", timeout=30)
        assert again.status_code == 200 and check_response(again.json())["id"] == first["id"]
        second = _post(workers, {"model": MODEL, "input": "Which number?", "previous_response_id": first["id"]})
        assert second["previous_response_id"] == first["id"] and second["status"] == "completed"
        items = httpx.get(f"{workers.url}/v1/responses/{second['id']}/input_items", timeout=30).json()
        assert items["data"][0]["content"][0]["text"] == "Which number?"


def test_a_background_response_is_cancelled_through_any_worker(workers: ServerProcess) -> None:
    for _ in range(4):
        started = _post(workers, {"model": hold_model(30), "input": "Take your time.", "background": True})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the upstream stream is open and held
            status = httpx.get(f"{workers.url}/v1/responses/{started['id']}", timeout=30).json()["status"]
            if status == "in_progress":
                break
            time.sleep(0.05)
        cancelled = httpx.post(f"{workers.url}/v1/responses/{started['id']}/cancel", timeout=30)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # and the worker running it stops it
            final = httpx.get(f"{workers.url}/v1/responses/{started['id']}", timeout=30).json()
            if final["status"] == "cancelled":
                break
            time.sleep(0.05)
        assert final["status"] == "cancelled"


def test_every_scrape_counts_all_workers(workers: ServerProcess) -> None:
    for _ in range(40):
        _post(workers, {"model": MODEL, "input": "hi", "store": False})
    totals = []
    for _ in range(6):  # new connections: scrapes land on either worker
        text = httpx.get(f"{workers.url}/metrics", timeout=30).text
        totals.append(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                          if line.startswith("ors_http_requests_total{") and 'route="/v1/responses"' in line
                          and 'method="POST"' in line))
    assert min(totals) >= 40 + 150 and len(set(totals)) == 1, totals
    assert "ors_responses_in_progress 0.0" in text
