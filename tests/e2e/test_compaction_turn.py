"""Compaction turns against the real server: ``{"type": "compaction_trigger"}`` last in the
input of ``POST /v1/responses`` (what Codex sends for remote compaction) answers with
exactly one ``compaction`` item, over JSON, SSE and WebSocket, on the embedded model and
through both kinds of upstream; the trigger is never stored nor echoed, and the item
works as the input of later turns.

``scripted-text`` is the deterministic scripted test model (it always writes "Hello,
world.", so the summary is known); SmolLM2 is the real model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.engine.compaction import SUMMARY_HEADER
from app.engine.sealing import PREFIX, Sealer
from app.main import create_app
from tests.client import Client, output_text
from tests.conftest import SMOL, scripted_backend
from tests.e2e.test_websocket import Socket
from tests.live import LiveServer

SCRIPTED = "scripted-text"
SUMMARY = "Hello, world."
TRIGGER = {"type": "compaction_trigger"}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "My name is Alice and my code word is PELICAN."},
    {"type": "message", "role": "assistant", "content": "Nice to meet you, Alice."},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    {"role": "user", "content": "We launch on Tuesday."},
]
WEATHER = {
    "type": "function", "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
EVENTS = ["response.created", "response.in_progress", "response.output_item.added", "response.output_item.done",
          "response.completed"]


@pytest.fixture(scope="module")
def scripted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, ScriptedBackend]]:
    """The real server with the scripted models only (no embedded model)."""
    scripted = scripted_backend()
    settings = Settings(default_model=SCRIPTED, data_dir=tmp_path_factory.mktemp("compaction-turn"))
    server = LiveServer(create_app(settings, backends=[scripted])).start()
    yield server, scripted
    server.stop()


@pytest.fixture()
def plain(scripted_server: tuple[LiveServer, ScriptedBackend]) -> Iterator[Client]:
    client = Client(scripted_server[0].url)
    yield client
    client.close()


@pytest.fixture()
def model(scripted_server: tuple[LiveServer, ScriptedBackend]) -> ScriptedBackend:
    return scripted_server[1]


def sealer_of(server: LiveServer) -> Sealer:
    return server.server.config.app.state.sealer  # type: ignore[no-any-return]


def the_compaction(response: dict[str, Any]) -> dict[str, Any]:
    """The one output item of a completed compaction turn, checked."""
    assert response["status"] == "completed", response
    (item,) = response["output"]
    assert (item["type"], item["status"]) == ("compaction", "completed")
    assert item["id"].startswith("cmp_") and item["encrypted_content"].startswith(PREFIX)
    assert response["usage"] is not None
    return item


def listed_inputs(client: Client, response_id: str) -> list[dict[str, Any]]:
    reply = client.http.get(f"/v1/responses/{response_id}/input_items", params={"order": "asc"})
    assert reply.status_code == 200, reply.text
    return reply.json()["data"]  # type: ignore[no-any-return]


# ---------------------------------------------------------------- the turn, delivered every way


def test_a_streamed_turn_is_one_compaction_item_then_completed(
        plain: Client, model: ScriptedBackend, scripted_server: tuple[LiveServer, ScriptedBackend]) -> None:
    before = len(model.requests)
    result = plain.stream(model=SCRIPTED, input=[*CONVERSATION, TRIGGER], store=False, instructions="Be terse.",
                          tools=[WEATHER], tool_choice="auto", parallel_tool_calls=True)
    assert result.types() == EVENTS
    item = the_compaction(result.final)
    assert result.events[3]["item"] == item
    assert result.events[2]["item"] == {**item, "encrypted_content": "", "status": "in_progress"}
    payload = sealer_of(scripted_server[0]).unseal("compaction", item["encrypted_content"])
    assert (payload["summary"], payload["model"]) == (SUMMARY, SCRIPTED)
    assert result.final["usage"]["output_tokens"] > 0
    # the summarising call: the whole conversation as a transcript, no tools offered
    [summarising] = model.requests[before:]
    assert summarising.tools == ()
    asked = summarising.messages[-1].content
    for said in ("PELICAN", "Nice to meet you", "get_weather", "sunny", "We launch on Tuesday."):
        assert said in asked
    assert "Be terse." in summarising.messages[0].content
    assert result.final["tools"][0]["name"] == "get_weather" and result.final["tool_choice"] == "auto"


def test_a_json_turn_answers_the_same_item(plain: Client) -> None:
    response = plain.create(model=SCRIPTED, input=[*CONVERSATION, TRIGGER])
    the_compaction(response)


def test_a_background_turn_compacts_too(plain: Client) -> None:
    queued = plain.create(model=SCRIPTED, input=[*CONVERSATION, TRIGGER], background=True)
    replay = plain.http.get(f"/v1/responses/{queued['id']}", params={"stream": "true"}, timeout=60)
    assert replay.status_code == 200
    final = plain.http.get(f"/v1/responses/{queued['id']}").json()
    the_compaction(final)


def test_a_websocket_turn(scripted_server: tuple[LiveServer, ScriptedBackend], model: ScriptedBackend) -> None:
    socket = Socket(scripted_server[0].url.replace("http://", "ws://") + "/v1/responses")
    try:
        socket.send(model=SCRIPTED, input=[*CONVERSATION, TRIGGER], store=False, tools=[WEATHER])
        events, final = socket.turn()
        assert [event["type"] for event in events] == EVENTS
        the_compaction(final)
        # the connection-local chain continues from the compaction turn: its input, then its item
        socket.send(model=SCRIPTED, input="And the code word?", store=False, previous_response_id=final["id"])
        _, after = socket.turn()
        assert after["status"] == "completed" and output_text(after) == SUMMARY
        seen = [(message.role, message.content) for message in model.requests[-1].messages]
        assert seen[-2:] == [("system", f"{SUMMARY_HEADER}\n{SUMMARY}"), ("user", "And the code word?")]
        assert seen[0] == ("user", CONVERSATION[0]["content"])
        socket.send(model=SCRIPTED, input=[TRIGGER, {"role": "user", "content": "x"}], store=False)
        _, refused = socket.turn()
        assert (refused["status"], refused["error"]["param"]) == (400, "input[0]")
    finally:
        socket.close()


# ---------------------------------------------------------------- what comes back later


def test_the_trigger_is_never_stored_nor_replayed(plain: Client, model: ScriptedBackend) -> None:
    compacted = plain.stream(model=SCRIPTED, input=[*CONVERSATION, TRIGGER])
    item = the_compaction(compacted.final)
    listed = listed_inputs(plain, compacted.final["id"])
    assert [entry["type"] for entry in listed] == ["message", "message", "function_call", "function_call_output",
                                                    "message"]
    stored = plain.http.get(f"/v1/responses/{compacted.final['id']}").json()
    assert stored["output"] == [item]

    later = plain.create(model=SCRIPTED, previous_response_id=compacted.final["id"], input="And the code word?")
    assert later["status"] == "completed"
    seen = model.requests[-1].messages
    assert f"{SUMMARY_HEADER}\n{SUMMARY}" in [message.content for message in seen if message.role == "system"]
    assert "compaction_trigger" not in str(listed_inputs(plain, later["id"]))


def test_the_item_sent_back_as_input_shows_the_model_its_summary(plain: Client, model: ScriptedBackend) -> None:
    """As Codex continues: the user messages it keeps, the compaction item last (as
    Codex sends it back: without ``status``), then the new turn; ``store: false``."""
    item = the_compaction(plain.create(model=SCRIPTED, input=[*CONVERSATION, TRIGGER], store=False))
    returned = {"type": "compaction", "id": item["id"], "encrypted_content": item["encrypted_content"]}
    kept = [CONVERSATION[0], CONVERSATION[4]]
    response = plain.stream(model=SCRIPTED, store=False, input=[*kept, returned,
                                                               {"role": "user", "content": "What is my code word?"}])
    assert response.final["status"] == "completed"
    seen = [(message.role, message.content) for message in model.requests[-1].messages]
    assert seen[-2:] == [("system", f"{SUMMARY_HEADER}\n{SUMMARY}"), ("user", "What is my code word?")]


def test_a_compaction_of_a_compaction_folds_the_earlier_summary_in(plain: Client, model: ScriptedBackend) -> None:
    first = the_compaction(plain.create(model=SCRIPTED, input=[*CONVERSATION, TRIGGER], store=False))
    plain.create(model=SCRIPTED, store=False, input=[first, {"role": "user", "content": "Then Wednesday."}, TRIGGER])
    asked = model.requests[-1].messages[-1].content
    assert SUMMARY in asked and "Then Wednesday." in asked


# ---------------------------------------------------------------- what is refused


@pytest.mark.parametrize(
    ("items", "param", "code"),
    [
        ([TRIGGER, CONVERSATION[0]], "input[0]", "invalid_value"),
        ([CONVERSATION[0], TRIGGER, CONVERSATION[4]], "input[1]", "invalid_value"),
        ([CONVERSATION[0], TRIGGER, TRIGGER], "input[2]", "invalid_value"),
        ([*CONVERSATION[:4], {"type": "compaction_trigger", "id": "ct_1"}], "input[4].id", "unknown_parameter"),
        ([CONVERSATION[0], {"type": "compaction_trigger", "summary": "x"}], "input[1].summary", "unknown_parameter"),
    ],
    ids=["first", "middle", "twice", "with-id", "with-field"],
)
def test_a_misplaced_or_dressed_trigger_is_a_400_naming_it(plain: Client, items: list[dict[str, Any]],
                                                           param: str, code: str) -> None:
    error = plain.error({"model": SCRIPTED, "input": items}, 400)
    assert (error["type"], error["code"], error["param"]) == ("invalid_request", code, param)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"},
                                    {"type": "allowed_tools", "mode": "required",
                                     "tools": [{"type": "function", "name": "get_weather"}]}],
                         ids=["required", "named", "allowed-required"])
def test_a_tool_choice_that_demands_a_call_is_refused(plain: Client, choice: Any) -> None:
    error = plain.error({"model": SCRIPTED, "input": [*CONVERSATION, TRIGGER], "tools": [WEATHER],
                         "tool_choice": choice}, 400)
    assert (error["code"], error["param"]) == ("invalid_value", "tool_choice")


def test_a_tool_choice_of_none_and_a_text_format_are_accepted(plain: Client) -> None:
    response = plain.create(model=SCRIPTED, input=[*CONVERSATION, TRIGGER], tools=[WEATHER], tool_choice="none",
                            text={"format": {"type": "json_object"}})
    the_compaction(response)
    assert response["text"]["format"] == {"type": "json_object"}


def test_other_endpoints_refuse_the_trigger(plain: Client) -> None:
    body = {"model": SCRIPTED, "input": [CONVERSATION[0], TRIGGER]}
    error = plain.error(body, 400, path="/v1/responses/compact")
    assert (error["code"], error["param"]) == ("unsupported_item", "input[1]")
    error = plain.error(body, 400, path="/v1/responses/input_tokens")
    assert (error["code"], error["param"]) == ("unsupported_item", "input[1]")


# ---------------------------------------------------------------- the embedded model


def test_smollm2_compacts_a_streamed_conversation(client: Client, server: LiveServer) -> None:
    result = client.stream(model=SMOL, input=[*CONVERSATION, TRIGGER], store=False, tools=[WEATHER])
    assert result.types() == EVENTS
    item = the_compaction(result.final)
    usage = result.final["usage"]
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 256
    assert sealer_of(server).unseal("compaction", item["encrypted_content"])["summary"].strip()
    after = client.create(model=SMOL, store=False, max_output_tokens=16,
                          input=[item, {"role": "user", "content": "What was my code word?"}])
    assert after["status"] in ("completed", "incomplete")


def test_smollm2_compacts_over_a_websocket(server: LiveServer) -> None:
    socket = Socket(server.url.replace("http://", "ws://") + "/v1/responses")
    try:
        socket.send(model=SMOL, input=[*CONVERSATION, TRIGGER], store=False)
        events, final = socket.turn(timeout=300)
    finally:
        socket.close()
    assert [event["type"] for event in events] == EVENTS
    the_compaction(final)
