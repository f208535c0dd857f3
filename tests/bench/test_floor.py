"""The proxy benchmark's floor (a bare forwarder on ors's stack), as a real process in
front of the real stub: it forwards a Responses request's text as a Chat Completions
request and passes the answer back, JSON whole and SSE as it streams, so the benchmark's
client reads it as it reads the stub. No timing is asserted."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from bench.floor import FloorProcess
from bench.proxy import _targets
from bench.proxy_load import CHAT_PROBE, block
from bench.stub import MODEL, TEXT, StubProcess
from tests.live import free_port

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def floor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StubProcess, FloorProcess]]:
    work = tmp_path_factory.mktemp("floor")
    with StubProcess(free_port(), work / "stub.log") as stub:
        with FloorProcess(free_port(), stub.base_url, work / "floor.log") as running:
            yield stub, running


def _post(floor: FloorProcess, stream: bool) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{floor.port}/v1/responses", timeout=10,
                      json={"model": MODEL, "input": "Hi", "store": False, "stream": stream})


def test_json_is_the_upstream_completion(floor: tuple[StubProcess, FloorProcess]) -> None:
    response = _post(floor[1], False)
    assert response.status_code == 200
    completion = response.json()
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"] == "".join(TEXT)


def test_stream_is_the_upstream_stream(floor: tuple[StubProcess, FloorProcess]) -> None:
    response = _post(floor[1], True)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    data = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(item) for item in data[:-1]]
    text = "".join(choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"])
    assert text == "".join(TEXT)
    assert chunks[-1]["usage"]["completion_tokens"] == len(TEXT)  # include_usage asked for, as ors asks


def test_other_paths_are_not_found(floor: tuple[StubProcess, FloorProcess]) -> None:
    assert httpx.get(f"http://127.0.0.1:{floor[1].port}/v1/responses/x", timeout=10).status_code == 404


@pytest.mark.parametrize("fmt", ["json", "sse"])
async def test_the_benchmark_reads_it_as_a_target(floor: tuple[StubProcess, FloorProcess], fmt: str) -> None:
    stub, forwarder = floor
    assert stub.process is not None
    targets = _targets(stub.port, stub.process.pid, 1, 1, forwarder)
    assert [target.name for target in targets] == ["direct", "stored", "unstored", "floor"]
    target = targets[-1]
    assert target.probe is CHAT_PROBE and forwarder.process is not None and target.pid == forwarder.process.pid
    samples = await block(target, fmt, 4, 12)
    assert (samples.requests, samples.failures, len(samples.latency)) == (12, 0, 12)
    assert len(samples.first_text) == 12  # the probe finds the text in what the floor passes back
