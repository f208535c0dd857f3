"""The proxy benchmark's stub upstream, through the real server: ors accepts its JSON and
SSE answers (checked against the spec by the test client), and the benchmark's own client
and load functions read them as intended. No timing is asserted."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from app.config import Settings
from app.main import create_app
from bench.proxy_load import CHAT_PROBE, RESPONSES_PROBE, Target, block, chain, client, open_streams, post, send
from bench.stub import MODEL, TEXT, StubProcess, hold_model
from tests.client import Client
from tests.live import LiveServer, free_port

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StubProcess]:
    with StubProcess(free_port(), tmp_path_factory.mktemp("stub") / "stub.log") as running:
        yield running


@pytest.fixture(scope="module")
def fronted(stub: StubProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """ors as the benchmark runs it: the stub upstream, its model the default one."""
    settings = Settings(upstream_url=stub.base_url, default_model=MODEL, data_dir=tmp_path_factory.mktemp("ors"))
    server = LiveServer(create_app(settings)).start()
    yield server
    server.stop()


@pytest.mark.parametrize("store", [True, False])
def test_json_answer_through_ors(fronted: LiveServer, store: bool) -> None:
    response = Client(fronted.url).create(model=MODEL, input="Hi", store=store)
    assert response["status"] == "completed"
    assert response["output"][-1]["content"][0]["text"] == "".join(TEXT)
    assert response["usage"]["output_tokens"] == len(TEXT)


@pytest.mark.parametrize("store", [True, False])
def test_streamed_answer_through_ors(fronted: LiveServer, store: bool) -> None:
    result = Client(fronted.url).stream(model=MODEL, input="Hi", store=store)
    assert result.final["status"] == "completed"
    assert result.text() == "".join(TEXT)
    assert result.types().count("response.output_text.delta") == len(TEXT)


def test_held_stream_completes(fronted: LiveServer) -> None:
    result = Client(fronted.url).stream(model=hold_model(0.2), input="Hi")
    assert result.final["status"] == "completed"
    assert result.text() == "".join(TEXT)


def test_chain_continues(fronted: LiveServer) -> None:
    client = Client(fronted.url)
    first = client.create(model=MODEL, input="Hi")
    second = client.create(model=MODEL, input="Again", previous_response_id=first["id"])
    assert second["previous_response_id"] == first["id"]
    assert second["status"] == "completed"


@pytest.mark.parametrize("stream", [False, True])
async def test_the_benchmarks_client_reads_the_stub(stub: StubProcess, stream: bool) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": stream,
            "stream_options": {"include_usage": True}}
    async with client(stub.port, 1) as http:
        exchanges = [await send(http, post("/v1/chat/completions", body), CHAT_PROBE, keep_body=True)
                     for _ in range(3)]  # kept alive
    for exchange in exchanges:
        assert exchange.ok, exchange.error
        assert exchange.first_text is not None
        assert exchange.terminal is stream


async def test_the_benchmarks_client_reads_ors_streams(fronted: LiveServer) -> None:
    async with client(fronted.port, 1) as http:
        exchange = await send(http, post("/v1/responses", {"model": MODEL, "input": "Hi", "stream": True}),
                              RESPONSES_PROBE, keep_body=True)
    assert exchange.ok, exchange.error
    assert exchange.first_text is not None and exchange.terminal
    assert b"event: response.completed\n" in exchange.body


async def test_load_functions_through_ors(fronted: LiveServer) -> None:
    pid = os.getpid()  # the live server runs in this process
    target = Target("stored", fronted.port, pid,
                    {"json": post("/v1/responses", {"model": MODEL, "input": "Hi"})}, RESPONSES_PROBE)
    samples = await block(target, "json", 4, 12)
    assert (samples.requests, samples.failures, len(samples.latency)) == (12, 0, 12)
    assert len(samples.new_connection) == 4  # each connection's first request, kept apart
    streams = await open_streams(fronted.port, pid, hold_model(0.3), 8, 0.3)
    assert streams["received_text"] == streams["ended_with_terminal_event"] == 8
    assert streams["terminal_events"] == {"completed": 8} and streams["cut"] == 0
    chained = await chain(fronted.port, MODEL, 3)
    assert chained["completed_turns"] == 3 and chained["failure"] is None


async def test_chain_against_the_upstream_alone(stub: StubProcess, fronted: LiveServer) -> None:
    """With the upstream's port, the chain also times the same conversations sent to the
    upstream directly, and what ors adds is derived from both."""
    chained = await chain(fronted.port, MODEL, 24, direct_port=stub.port)
    assert chained["completed_turns"] == 24 and chained["failure"] is None
    # turn 2 and turn 24 measured in alternation after the chain, the sequential turns too
    assert (chained["early_turns"], chained["late_turns"]) == ("2", "24")
    for key in ("early_ms", "late_ms", "late_over_early", "sequential_early_ms", "sequential_late_ms"):
        assert isinstance(chained[key], float), key
    for key in ("direct_early_ms", "direct_late_ms", "added_early_ms", "added_late_ms", "added_late_over_early"):
        assert isinstance(chained[key], float), key
    assert chained["added_late_ms"] == pytest.approx(chained["late_ms"] - chained["direct_late_ms"])
