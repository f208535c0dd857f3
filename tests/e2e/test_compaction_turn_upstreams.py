"""Compaction turns through upstreams: ors compacts with the upstream's model, and the
upstream is sent plain summarising turns, never the trigger.

* A Responses upstream: a second real ors on loopback generating with the scripted test
  models (deterministic; it records what it is sent).
* A Chat Completions upstream: llama-cpp-python's own server with SmolLM2 (marked ``model``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from app.backends.base import Delta, Finish, GenerationRequest, TextDelta, Usage
from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.main import create_app
from tests.client import Client
from tests.e2e.test_compaction_turn import CONVERSATION, EVENTS, TRIGGER, WEATHER, sealer_of, the_compaction
from tests.e2e.test_responses_upstream import Recorder
from tests.e2e.test_websocket import Socket
from tests.live import LiveServer, serve_in_front
from tests.upstream_server import running_llama_server

SUMMARY = "Alice's code word is PELICAN; launch on Tuesday."


def summariser(request: GenerationRequest) -> list[Delta]:
    """Answers every call with the same summary (and a usage, as a real upstream reports)."""
    return [TextDelta(SUMMARY), Finish("stop", Usage(len(request.messages) * 10, 9))]


SENT: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def responses_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("upstream-ors"), default_model="summariser"),
                     backends=[ScriptedBackend({"summariser": summariser})])
    app.add_middleware(Recorder, bodies=SENT, peers=[])
    server = LiveServer(app).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def front(responses_upstream: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("front")
    server = serve_in_front(data, f"""
[upstreams.far]
base_url = "{responses_upstream.url}/v1"
wire_api = "responses"
prefixes = ["far/"]
""", default_model="far/summariser")
    yield server
    server.stop()


@pytest.fixture()
def client(front: LiveServer) -> Iterator[Client]:
    SENT.clear()
    client = Client(front.url)
    yield client
    client.close()


def test_a_streamed_turn_through_a_responses_upstream(client: Client, front: LiveServer) -> None:
    result = client.stream(model="far/summariser", input=[*CONVERSATION, TRIGGER], store=False, tools=[WEATHER],
                           instructions="You are a coding agent.")
    assert result.types() == EVENTS
    item = the_compaction(result.final)
    assert sealer_of(front).unseal("compaction", item["encrypted_content"])["summary"] == SUMMARY
    assert result.final["usage"]["output_tokens"] == 9
    (sent,) = SENT
    assert sent["store"] is False and sent["model"] == "summariser" and not sent.get("tools")
    assert "compaction_trigger" not in json.dumps(sent)
    assert "PELICAN" in sent["input"][-1]["content"] and "sunny" in sent["input"][-1]["content"]


def test_later_turns_through_the_upstream_see_the_summary_not_the_trigger(client: Client) -> None:
    compacted = client.create(model="far/summariser", input=[*CONVERSATION, TRIGGER])
    item = the_compaction(compacted)
    SENT.clear()
    client.create(model="far/summariser", previous_response_id=compacted["id"], input="What is the code word?")
    client.create(model="far/summariser", store=False,
                  input=[CONVERSATION[0], item, {"role": "user", "content": "What is the code word?"}])
    for sent in SENT:
        assert "compaction_trigger" not in json.dumps(sent)
        systems = [entry["content"] for entry in sent["input"] if entry.get("role") == "system"]
        assert any(SUMMARY in text for text in systems), sent["input"]


def test_a_websocket_turn_through_a_responses_upstream(front: LiveServer) -> None:
    socket = Socket(front.url.replace("http://", "ws://") + "/v1/responses")
    try:
        socket.send(model="far/summariser", input=[*CONVERSATION, TRIGGER], store=False)
        events, final = socket.turn()
    finally:
        socket.close()
    assert [event["type"] for event in events] == EVENTS
    the_compaction(final)


@pytest.mark.model
def test_a_chat_completions_upstream_summarises(tmp_path_factory: pytest.TempPathFactory) -> None:
    with running_llama_server(model_alias="upstream-smollm2") as upstream_url:
        settings = Settings(upstream_url=upstream_url, default_model="upstream-smollm2",
                            data_dir=tmp_path_factory.mktemp("chat-front"))
        server = LiveServer(create_app(settings, backends=[])).start()
        try:
            client = Client(server.url)
            streamed = client.stream(model="upstream-smollm2", input=[*CONVERSATION, TRIGGER], store=False)
            assert streamed.types() == EVENTS
            item = the_compaction(streamed.final)
            assert sealer_of(server).unseal("compaction", item["encrypted_content"])["summary"].strip()
            whole = client.create(model="upstream-smollm2", input=[*CONVERSATION, TRIGGER], store=False)
            the_compaction(whole)
            client.close()
        finally:
            server.stop()
