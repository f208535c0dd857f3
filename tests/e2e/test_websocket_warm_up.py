"""WebSocket warm-ups (``generate: false``) against the real server process: acknowledged
at once with no model call and no output, recorded like any response (connection-local
with ``store: false``, stored and retrievable with ``store: true``), the next turn chained
from them with only new input; and on the embedded model, the warm-up's prompt is in the
prompt cache when the next turn comes. Every event and envelope is checked
(``tests.ws_client``), every HTTP answer against the spec (``tests.client``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.main import create_app
from tests.client import Client
from tests.conftest import SMOL, scripted_backend
from tests.live import LiveServer
from tests.ws_client import MuxSocket, Turn

TOOLS = [{"type": "function", "name": "read_file", "description": "Read one file of the repository.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
INSTRUCTIONS = "You are a careful coding agent."


def ws_url(server: LiveServer) -> str:
    return server.url.replace("http://", "ws://") + "/v1/responses"


@pytest.fixture(scope="module")
def warm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, ScriptedBackend]]:
    backend = scripted_backend()
    settings = Settings(data_dir=tmp_path_factory.mktemp("ws-warm"), default_model="scripted-text")
    server = LiveServer(create_app(settings, backends=[backend])).start()
    yield server, backend
    server.stop()


@pytest.fixture()
def sock(warm_server: tuple[LiveServer, ScriptedBackend]) -> Iterator[MuxSocket]:
    socket = MuxSocket(ws_url(warm_server[0]))
    yield socket
    socket.close()


def warm_up(sock: MuxSocket, **body: Any) -> Turn:
    sock.send(generate=False, **body)
    [turn] = sock.turns(1)
    assert turn.types() == ["response.created", "response.in_progress", "response.completed"]
    final = turn.final
    assert final["status"] == "completed" and final["output"] == []
    assert final["usage"]["input_tokens"] == final["usage"]["output_tokens"] == 0
    return turn


@pytest.mark.parametrize("store", [False, True])
def test_a_warm_up_is_acknowledged_without_a_model_call(sock: MuxSocket, store: bool,
                                                        warm_server: tuple[LiveServer, ScriptedBackend]) -> None:
    backend = warm_server[1]
    asked = len(backend.requests)
    warm = warm_up(sock, model="scripted-text", instructions=INSTRUCTIONS, tools=TOOLS, input="read the README",
                   store=store)
    assert len(backend.requests) == asked, "a warm-up called the model"
    assert warm.final["instructions"] == INSTRUCTIONS and [t["name"] for t in warm.final["tools"]] == ["read_file"]
    # the next turn sends only its new input; as on any chain, its own instructions and tools
    sock.send(model="scripted-text", instructions=INSTRUCTIONS, tools=TOOLS, input="now summarise it",
              previous_response_id=warm.id, store=store)
    [turn] = sock.turns(1)
    assert turn.final["status"] == "completed" and turn.final["previous_response_id"] == warm.id
    request = backend.requests[-1]
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", INSTRUCTIONS), ("user", "read the README"), ("user", "now summarise it")]
    assert [tool.name for tool in request.tools] == ["read_file"]


def test_a_stored_warm_up_is_retrievable_and_continued_from_anywhere(
        sock: MuxSocket, warm_server: tuple[LiveServer, ScriptedBackend]) -> None:
    server, backend = warm_server
    warm = warm_up(sock, model="scripted-text", instructions=INSTRUCTIONS, tools=TOOLS, input="read the README")
    client = Client(server.url)
    try:
        reply = client.http.get(f"/v1/responses/{warm.id}")
        assert reply.status_code == 200, reply.text
        stored = reply.json()
        assert stored["status"] == "completed" and stored["output"] == [] and stored["instructions"] == INSTRUCTIONS
        assert stored["tools"] == warm.final["tools"]
        items = client.http.get(f"/v1/responses/{warm.id}/input_items").json()["data"]
        assert [item["content"][0]["text"] for item in items] == ["read the README"]
        # over HTTP, as from any other connection
        continued = client.create(model="scripted-text", input="go on", previous_response_id=warm.id)
        assert continued["status"] == "completed"
        assert [m.content for m in backend.requests[-1].messages] == ["read the README", "go on"]
    finally:
        client.close()


def test_a_store_false_warm_up_lives_on_its_connection_only(
        sock: MuxSocket, warm_server: tuple[LiveServer, ScriptedBackend]) -> None:
    warm = warm_up(sock, model="scripted-text", input="hello", store=False)
    other = MuxSocket(ws_url(warm_server[0]))
    try:
        other.send(model="scripted-text", input="go on", store=False, previous_response_id=warm.id)
        [error] = other.turns(1)
        assert error.final["error"]["code"] == "previous_response_not_found"
    finally:
        other.close()


def test_a_warm_up_may_bring_tools_alone(sock: MuxSocket, warm_server: tuple[LiveServer, ScriptedBackend]) -> None:
    backend = warm_server[1]
    warm = warm_up(sock, model="scripted-text", tools=TOOLS, store=False)  # no instructions, no input
    sock.send(model="scripted-text", tools=TOOLS, input="hi", previous_response_id=warm.id, store=False)
    [turn] = sock.turns(1)
    assert turn.final["status"] == "completed" and [m.content for m in backend.requests[-1].messages] == ["hi"]
    sock.send(model="scripted-text", input="hi")  # a turn that generates still needs input
    sock.send(model="scripted-text", tools=TOOLS)
    assert sock.turns(2)[-1].final["error"]["code"] == "empty_input"


def test_warm_ups_on_streams_carry_their_stream_id(sock: MuxSocket) -> None:
    sock.send("a", model="scripted-text", input="one", generate=False)
    sock.send("b", model="scripted-text", input="two", generate=True)
    turns = {turn.stream: turn for turn in sock.turns(2)}
    assert turns["a"].final["output"] == [] and turns["b"].final["output"]
    assert all(event["stream_id"] == "a" for event in turns["a"].events)


def counted_tokens(server: LiveServer, body: dict[str, Any]) -> int:
    """The prompt tokens of ``body`` on its model, as the server counts them."""
    client = Client(server.url)
    try:
        counted = client.http.post("/v1/responses/input_tokens", json=body)
        assert counted.status_code == 200, counted.text
        return int(counted.json()["input_tokens"])
    finally:
        client.close()


def test_a_warm_up_fills_the_embedded_models_prompt_cache(server: LiveServer) -> None:
    """The prompt of a warm-up is evaluated into llama-server's cache while the client
    gets its answer; the next turn finds all of it cached. The instructions open with a
    word never seen before, so nothing else could have cached this prefix."""
    instructions = f"Session {uuid.uuid4().hex}. " + "Answer in one short sentence and never use a list. " * 25
    warm_body = {"model": SMOL, "instructions": instructions, "tools": TOOLS, "input": "Say hello.", "store": False}
    prompt_tokens = counted_tokens(server, warm_body)
    sock = MuxSocket(ws_url(server))
    try:
        warm = warm_up(sock, **warm_body)
        sock.send(model=SMOL, instructions=instructions, tools=TOOLS, input="And now goodbye.", store=False,
                  previous_response_id=warm.id, max_output_tokens=16)
        [turn] = sock.turns(1, timeout=300)
    finally:
        sock.close()
    assert "usage" in turn.final, turn.final
    usage = turn.final["usage"]
    assert turn.final["status"] in ("completed", "incomplete")
    # all of the warm-up's prompt but the opening of the assistant's turn it ended with
    assert usage["input_tokens_details"]["cached_tokens"] >= prompt_tokens - 8, (usage, prompt_tokens)
    assert usage["input_tokens"] > prompt_tokens


def test_a_warm_up_holds_for_a_turn_that_brings_more_system_messages(server: LiveServer) -> None:
    """Codex's shape: its warm-up carries its instructions as a developer message and its
    tools; the first turn chains from it with more developer messages (permissions, the
    environment) before the task. The warm-up's prompt is still the turn's beginning: the
    turn finds all of it cached (the system messages are not merged into one, which would
    put the new ones before the tools and rewrite the prompt from there)."""
    developer = f"Session {uuid.uuid4().hex}. " + "Answer in one short sentence and never use a list. " * 25
    warm_input = [{"type": "message", "role": "developer", "content": developer}]
    warm_body = {"model": SMOL, "tools": TOOLS, "input": warm_input, "store": False}
    prompt_tokens = counted_tokens(server, warm_body)
    sock = MuxSocket(ws_url(server))
    try:
        warm = warm_up(sock, **warm_body)
        sock.send(model=SMOL, tools=TOOLS, store=False, previous_response_id=warm.id, max_output_tokens=16, input=[
            {"type": "message", "role": "developer", "content": "The sandbox is read-only."},
            {"type": "message", "role": "user", "content": "<environment_context>cwd: /repo</environment_context>"},
            {"type": "message", "role": "user", "content": "Say hello."}])
        [turn] = sock.turns(1, timeout=300)
    finally:
        sock.close()
    usage = turn.final["usage"]
    assert turn.final["status"] in ("completed", "incomplete")
    assert usage["input_tokens_details"]["cached_tokens"] >= prompt_tokens - 8, (usage, prompt_tokens)
    assert usage["input_tokens"] > prompt_tokens + 20
