"""Logs of a real ``ors serve`` process: JSON lines, request ids, nothing secret; lines
written off the event loop, yet while the server serves."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import SMOL
from tests.live import ServerProcess

# Every test starts `ors serve` with SmolLM2 as its default model.
pytestmark = pytest.mark.model

KEY = "sk-do-not-log-4f1c9e"
USER_TEXT = "PELICAN-7731 is my secret"


@pytest.fixture(scope="module")
def process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        {"ORS_DEFAULT_MODEL": SMOL, "ORS_API_KEYS": KEY, "ORS_LOG_FORMAT": "json", "ORS_LOG_LEVEL": "debug"},
        tmp_path_factory.mktemp("logs"),
    )
    server.start()
    yield server
    server.kill()


def _lines(log: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.splitlines() if line.strip()]


def test_json_lines_with_request_ids_and_no_secrets(process: ServerProcess, tmp_path: Path) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "x-request-id": "trace-42"}
    body = {"model": SMOL, "input": USER_TEXT, "max_output_tokens": 16, "not_a_field": 1}
    reply = httpx.post(f"{process.url}/v1/responses", json=body, headers=headers, timeout=120)
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "trace-42"

    fresh = httpx.post(f"{process.url}/v1/responses", json={"model": SMOL, "input": "hi", "max_output_tokens": 16},
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    assert fresh.headers["x-request-id"].startswith("req_")
    refused = httpx.post(f"{process.url}/v1/responses", json={"input": "x"}, timeout=30,
                         headers={"x-request-id": "bad id with spaces"})
    assert refused.status_code == 401 and refused.headers["x-request-id"].startswith("req_")

    process.terminate()
    log = process.log()
    lines = _lines(log)  # every line is one JSON object
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    mine = [line for line in lines if line.get("request_id") == "trace-42"]
    assert any("not_a_field" in str(line["message"]) for line in mine)
    # one access line per request, written once its response is over, with its duration
    access = [line for line in lines if line["logger"] == "ors.access"]
    assert [line["request_id"] for line in access if "/v1/responses" in str(line["message"])] == [
        "trace-42", fresh.headers["x-request-id"], refused.headers["x-request-id"]]
    assert re.fullmatch(r'127\.0\.0\.1:\d+ - "POST /v1/responses HTTP/1\.1" 200 \d+\.\dms', str(access[-3]["message"]))
    assert '"POST /v1/responses HTTP/1.1" 401 ' in str(access[-1]["message"])
    assert not [line for line in lines if line["logger"] == "uvicorn.access"]  # not twice
    assert KEY not in log and "PELICAN-7731" not in log


def test_an_access_line_is_written_while_serving(tmp_path: Path) -> None:
    """The server's lines are written by a thread of their own: the line of a request
    reaches the log while the server goes on serving (not only at its exit)."""
    server = ServerProcess({"ORS_DEFAULT_MODEL": SMOL}, tmp_path).start()
    try:
        reply = httpx.get(f"{server.url}/healthz", headers={"x-request-id": "soon-1"}, timeout=10)
        assert reply.status_code == 200
        deadline = time.monotonic() + 5
        while "[soon-1]" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        line = next(line for line in server.log().splitlines() if "[soon-1]" in line)
        assert ' "GET /healthz HTTP/1.1" 200 ' in line
        assert server.process is not None and server.process.poll() is None
    finally:
        server.kill()
