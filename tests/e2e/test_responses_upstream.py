"""ors in front of an upstream that speaks ``/v1/responses`` natively: a second real ors
server on loopback, which generates with the scripted backend (deterministic answers
that say what the model was shown) and is called statelessly (``store: false``).

The front adds what the upstream is not asked for: storage and ``previous_response_id``,
the replay gate, the WebSocket mode, compaction. Every stream the client reads is checked
by the compliance stream checker (``tests.client``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from app.backends.base import Delta, Finish, GenerationRequest, TextDelta, ToolCallDelta, Usage
from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.main import create_app
from app.protocol.tools import custom_parameters
from tests.client import Client, output_text
from tests.e2e.test_custom_tools import SUPERSET
from tests.e2e.test_streamed_ids import assert_ids_kept
from tests.e2e.test_websocket import Socket
from tests.live import LiveServer, serve_in_front
from tests.upstream_server import ScriptedUpstream, running_scripted_upstream

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False},
}


def echo(request: GenerationRequest) -> list[Delta]:
    """Says which user messages the model was shown, in order."""
    seen = [message.content for message in request.messages if message.role == "user"]
    return [TextDelta("saw: "), TextDelta(" | ".join(seen)), Finish("stop", Usage(len(seen), 2))]


def weather(request: GenerationRequest) -> list[Delta]:
    """Calls ``get_weather`` until it is given the call's output, then reports it."""
    outputs = [message.content for message in request.messages if message.role == "tool"]
    if outputs:
        return [TextDelta(f"It is {outputs[-1]} in Paris."), Finish("stop")]
    return [ToolCallDelta(0, name="get_weather", arguments='{"city":'), ToolCallDelta(0, arguments=' "Paris"}'),
            Finish("tool_calls")]


def patcher(request: GenerationRequest) -> list[Delta]:
    """Calls ``apply_patch`` (a custom tool at the front, a function of one string here)."""
    return [ToolCallDelta(0, name="apply_patch", arguments='{"input": "*** Begin Patch\\n'),
            ToolCallDelta(0, arguments='*** End Patch\\n"}'), Finish("tool_calls")]


class Recorder:
    """Records the JSON bodies POSTed to the upstream, and the address each came from
    (ASGI middleware of the test)."""

    def __init__(self, app: Any, bodies: list[dict[str, Any]], peers: list[Any]) -> None:
        self.app = app
        self.bodies = bodies
        self.peers = peers

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages = []
        while True:
            message = await receive()
            messages.append(message)
            if not message.get("more_body"):
                break
        self.bodies.append(json.loads(b"".join(m.get("body", b"") for m in messages)))
        self.peers.append(tuple(scope["client"]))
        replay = iter(messages)

        async def again() -> dict[str, Any]:
            return next(replay, None) or await receive()

        await self.app(scope, again, send)


RECORDED: list[dict[str, Any]] = []
PEERS: list[Any] = []


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, list[dict[str, Any]]]]:
    """The second ors: a real server, generating with scripted models."""
    scripted = ScriptedBackend({"echo": echo, "weather": weather, "patcher": patcher})
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("upstream-ors"), default_model="echo"),
                     backends=[scripted])
    app.add_middleware(Recorder, bodies=RECORDED, peers=PEERS)
    server = LiveServer(app).start()
    yield server, RECORDED
    server.stop()


@pytest.fixture(scope="module")
def front_server(upstream: tuple[LiveServer, list[dict[str, Any]]],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("front")
    server = serve_in_front(data, f"""
[upstreams.far]
base_url = "{upstream[0].url}/v1"
wire_api = "responses"
prefixes = ["far/"]
list_models = true
""", default_model="far/echo")
    yield server
    server.stop()


@pytest.fixture()
def front(front_server: LiveServer) -> Iterator[Client]:
    client = Client(front_server.url)
    yield client
    client.close()


@pytest.fixture()
def sent(upstream: tuple[LiveServer, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What the upstream is sent during this test."""
    upstream[1].clear()
    PEERS.clear()
    return upstream[1]


def test_a_turn_is_sent_statelessly(front: Client, sent: list[dict[str, Any]]) -> None:
    response = front.create(model="far/echo", input="hello", instructions="Be brief.", temperature=0.5)
    assert response["model"] == "far/echo" and response["store"] is True
    assert output_text(response) == "saw: hello"
    assert response["usage"]["input_tokens"] == 1
    (body,) = sent
    # a JSON answer is asked whole (nobody sees it before it ends); a stream is streamed
    assert body["store"] is False and body["stream"] is False and "previous_response_id" not in body
    assert body["model"] == "echo" and body["temperature"] == 0.5
    assert body["input"] == [{"type": "message", "role": "system", "content": "Be brief."},
                             {"type": "message", "role": "user", "content": "hello"}]
    assert front.stream(model="far/echo", input="hello").text() == "saw: hello"
    assert sent[1]["stream"] is True


def test_one_kept_alive_connection_serves_consecutive_turns(front: Client, sent: list[dict[str, Any]]) -> None:
    front.create(input="one")
    front.create(input="two")
    assert len(PEERS) == 2 and PEERS[0] == PEERS[1]


def test_the_front_stores_and_chains(front: Client, sent: list[dict[str, Any]]) -> None:
    first = front.create(input="My name is Ada.")
    second = front.stream(previous_response_id=first["id"], input="What is my name?")
    assert second.final["previous_response_id"] == first["id"]
    assert second.text() == "saw: My name is Ada. | What is my name?"
    assert [item.get("role", item["type"]) for item in sent[-1]["input"]] == ["user", "assistant", "user"]
    assert sent[-1]["input"][1]["content"][0]["text"] == "saw: My name is Ada."
    stored = front.http.get(f"/v1/responses/{second.final['id']}").json()
    assert stored["output"] == second.final["output"]


def test_streaming_through_the_front_is_conformant(front: Client) -> None:
    result = front.stream(model="far/echo", input="stream me")
    assert result.types()[:2] == ["response.created", "response.in_progress"]
    assert result.types()[-1] == "response.completed"
    assert result.text() == "saw: stream me"


def test_a_tool_call_round_trip_through_the_replay_gate(front: Client, sent: list[dict[str, Any]]) -> None:
    called = front.stream(model="far/weather", input="Weather in Paris?", tools=[WEATHER])
    (call,) = called.final["output"]
    assert (call["type"], call["name"], call["arguments"]) == ("function_call", "get_weather", '{"city": "Paris"}')
    assert sent[-1]["tools"][0]["name"] == "get_weather"

    refused = front.error({"model": "far/weather", "previous_response_id": called.final["id"], "tools": [WEATHER],
                           "input": [{"type": "function_call_output", "call_id": "call_unknown", "output": "x"}]}, 400)
    assert refused["param"] == "input[0]"
    calls_before = len(sent)

    answered = front.create(model="far/weather", previous_response_id=called.final["id"], tools=[WEATHER],
                            input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}])
    assert output_text(answered) == "It is sunny in Paris."
    assert len(sent) == calls_before + 1  # the refused turn never reached the upstream
    kinds = [item["type"] for item in sent[-1]["input"]]
    assert kinds == ["message", "function_call", "function_call_output"]
    assert sent[-1]["input"][1]["call_id"] == sent[-1]["input"][2]["call_id"] == call["call_id"]


def test_streamed_ids_and_call_ids_are_the_final_and_stored_ones(front_server: LiveServer,
                                                                  sent: list[dict[str, Any]]) -> None:
    """The front names the items and calls itself (the upstream's own ids stay
    upstream), and a client reads the same ids in the stream, the final response and
    the stored one; a custom tool (with its Lark grammar, which only the front knows)
    reaches the upstream as the function of one string, and its call comes back custom."""
    lark_patch = {"type": "custom", "name": "apply_patch", "description": "Apply a patch.",
                  "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'}}
    client = Client(front_server.url, spec=SUPERSET)
    try:
        for model, tools, kind in (("far/weather", [WEATHER], "function_call"),
                                   ("far/patcher", [lark_patch], "custom_tool_call")):
            result = client.stream(model=model, input="Go.", tools=tools)
            stored = client.http.get(f"/v1/responses/{result.final['id']}").json()
            assert_ids_kept(result.events, result.final, stored, kind)
        assert sent[-1]["tools"] == [{"type": "function", "name": "apply_patch", "description": "Apply a patch.",
                                      "parameters": custom_parameters(None), "strict": True}]
        assert result.final["output"][0]["input"] == "*** Begin Patch\n*** End Patch\n"
    finally:
        client.close()


def test_the_websocket_mode_through_the_front(front_server: LiveServer) -> None:
    socket = Socket(front_server.url.replace("http://", "ws://") + "/v1/responses")
    try:
        socket.send(model="far/echo", input="one", store=False)
        _, first = socket.turn()
        socket.send(model="far/echo", input="two", store=False, previous_response_id=first["id"])
        events, second = socket.turn()
        assert output_text(second) == "saw: one | two"
        assert events[-1]["type"] == "response.completed"
    finally:
        socket.close()


def test_compaction_through_the_front(front: Client) -> None:
    first = front.create(input="Remember the number 42.")
    reply = front.http.post("/v1/responses/compact", json={"model": "far/echo", "previous_response_id": first["id"]})
    assert reply.status_code == 200, reply.text
    assert any(item["type"] == "compaction" for item in reply.json()["output"])


def test_models_asks_the_upstream(front: Client) -> None:
    listed = {m["id"] for m in front.http.get("/v1/models").json()["data"]}
    assert {"far/echo", "far/weather"} <= listed


def test_an_unknown_upstream_model_is_404(front: Client) -> None:
    error = front.error({"model": "far/nothing", "input": "x"}, 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"


# ---------------------------------------------------------------- a sloppy upstream


@pytest.fixture(scope="module")
def sloppy() -> Iterator[ScriptedUpstream]:
    """A scripted stand-in for a Responses upstream that gets the protocol wrong on
    demand (no real server produces these faults when asked)."""
    with running_scripted_upstream() as scripted:
        yield scripted


@pytest.fixture(scope="module")
def sloppy_front(sloppy: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    data = tmp_path_factory.mktemp("sloppy-front")
    server = serve_in_front(data, f"""
[upstreams.sloppy]
base_url = "{sloppy.base_url}"
wire_api = "responses"
prefixes = ["sloppy/"]

[upstreams.held]
base_url = "{sloppy.base_url}"
wire_api = "responses"
prefixes = ["held/"]
[upstreams.held.dialect]
hold_text = true
""", default_model="sloppy/x")
    client = Client(server.url)
    yield client
    client.close()
    server.stop()


def test_a_sloppy_stream_reaches_the_client_conformant(sloppy_front: Client, sloppy: ScriptedUpstream) -> None:
    """No ``sequence_number``s, items without required fields (no id, no status, no
    content), a final message longer than what was streamed and a call whose final
    arguments differ from the streamed ones: the client's stream passes the checker
    and carries the final items."""
    model = sloppy.stream(
        {"type": "response.created", "response": {"status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "message"}},
        {"type": "response.output_text.delta", "output_index": 0, "delta": "Hel"},
        {"type": "response.output_text.delta", "delta": "lo"},
        {"type": "response.output_item.done", "output_index": 0,
         "item": {"type": "message", "content": [{"type": "output_text", "text": "Hello, world."}]}},
        {"type": "response.output_item.added", "output_index": 1,
         "item": {"type": "function_call", "name": "get_weather", "call_id": "c1"}},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": '{"city": "Par'},
        {"type": "response.output_item.done", "output_index": 1,
         "item": {"type": "function_call", "name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"type": "response.completed", "response": {"status": "completed"}},
    )
    result = sloppy_front.stream(model=f"sloppy/{model}", input="hi", tools=[WEATHER])
    message, call = result.final["output"]
    assert output_text(result.final) == "Hello, world."
    assert (call["name"], call["arguments"]) == ("get_weather", '{"city": "Paris"}')
    assert [e["sequence_number"] for e in result.events] == list(range(len(result.events)))


def test_a_divergent_final_item_wins_when_text_is_held(sloppy_front: Client, sloppy: ScriptedUpstream) -> None:
    model = sloppy.stream(
        {"type": "response.output_text.delta", "output_index": 0, "delta": "Hi there"},
        {"type": "response.output_item.done", "output_index": 0,
         "item": {"type": "message", "content": [{"type": "output_text", "text": "Goodbye"}]}},
        {"type": "response.completed", "response": {"status": "completed"}},
    )
    assert sloppy_front.stream(model=f"sloppy/{model}", input="hi").text() == "Hi there"
    assert sloppy_front.stream(model=f"held/{model}", input="hi").text() == "Goodbye"


def test_an_upstream_failure_mid_stream(sloppy_front: Client, sloppy: ScriptedUpstream) -> None:
    model = sloppy.stream(
        {"type": "response.output_text.delta", "output_index": 0, "delta": "partial"},
        {"type": "response.failed", "response": {"status": "failed", "error": {"code": "x", "message": "it broke"}}},
    )
    result = sloppy_front.stream(model=f"sloppy/{model}", input="hi")
    assert result.types()[-2:] == ["error", "response.failed"]
    assert result.final["error"]["code"] == "upstream_error"


def test_an_upstream_400_naming_a_param(sloppy_front: Client, sloppy: ScriptedUpstream) -> None:
    model = sloppy.respond(400, {"error": {"type": "invalid_request", "message": "temperature too high",
                                           "param": "temperature"}})
    error = sloppy_front.error({"model": f"sloppy/{model}", "input": "hi", "temperature": 1.9}, 400)
    assert (error["code"], error["param"]) == ("upstream_rejected", "temperature")
