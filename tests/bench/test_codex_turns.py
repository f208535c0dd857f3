"""The Codex benchmark's stateless turns, rebuilt from tapped WebSocket frames (made up
here, shaped as Codex sends them and the server answers): a chained turn carries the
chain's earlier inputs and outputs before its own input, a warm-up is part of the chain
but no turn, and the WebSocket's own fields are gone."""

from __future__ import annotations

from typing import Any

import pytest

from bench.codex_turns import model_turns, output_budget
from tests.asgi_tap import Connection

TOOLS = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _create(items: object, previous: str | None = None, **extra: Any) -> dict[str, Any]:
    frame = {"type": "response.create", "model": "m", "instructions": "Be brief.", "tools": TOOLS,
             "input": items, "store": False, "stream": True, **extra}
    return frame if previous is None else {**frame, "previous_response_id": previous}


def _answer(response_id: str, output: list[dict[str, Any]], *, status: str = "completed",
            produced: int = 5) -> list[dict[str, Any]]:
    usage = {"input_tokens": 0 if not produced else 100, "output_tokens": produced}
    response = {"id": response_id, "object": "response", "status": status, "output": output, "usage": usage}
    return [{"type": "response.created", "response": {**response, "status": "in_progress", "output": []}},
            {"type": "response.in_progress", "response": {**response, "status": "in_progress", "output": []}},
            {"type": f"response.{status}", "response": response}]


def _connection(*exchanges: tuple[dict[str, Any], list[dict[str, Any]]]) -> Connection:
    connection = Connection("/v1/responses")
    for frame, events in exchanges:
        connection.frames.append(("in", frame))
        connection.frames += [("out", event) for event in events]
    return connection


CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "exec_command",
        "arguments": '{"cmd":"ls"}', "status": "completed"}
RESULT = {"type": "function_call_output", "call_id": "call_1", "output": "notes.txt"}
SAID = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "Done.", "annotations": []}]}


def test_a_chain_is_made_stateless_and_a_warm_up_is_no_turn() -> None:
    connection = _connection(
        (_create([_user("context")], generate=False), _answer("resp_w", [], produced=0)),
        (_create([_user("run ls")], "resp_w"), _answer("resp_1", [CALL], produced=12)),
        (_create([RESULT], "resp_1"), _answer("resp_2", [SAID], status="incomplete", produced=3)),
    )
    turns = model_turns([connection])
    assert [turn.body["input"] for turn in turns] == [
        [_user("context"), _user("run ls")],
        [_user("context"), _user("run ls"), CALL, RESULT],
    ]
    for turn in turns:
        assert turn.body.keys() == {"model", "instructions", "tools", "input", "store"}
        assert turn.body["instructions"] == "Be brief." and turn.body["tools"] == TOOLS
    assert [(turn.response["id"], turn.status, turn.output_tokens) for turn in turns] == [
        ("resp_1", "completed", 12), ("resp_2", "incomplete", 3)]


def test_a_refused_or_unanswered_turn_is_left_out_and_chains_cross_connections() -> None:
    first = _connection(
        (_create("hello"), _answer("resp_1", [SAID])),
        (_create([_user("bad")], "resp_1", stream_id="s"),
         [{"type": "error", "status": 400, "error": {"message": "no", "param": "input"}}]),
    )
    second = _connection(
        (_create([_user("again")], "resp_1"), _answer("resp_2", [SAID])),
        (_create([_user("cut off")], "resp_2"), [{"type": "response.created", "response": {"id": "resp_3"}}]),
    )
    turns = model_turns([first, second])
    assert [turn.body["input"] for turn in turns] == [[_user("hello")], [_user("hello"), SAID, _user("again")]]
    assert all("stream_id" not in turn.body and "previous_response_id" not in turn.body for turn in turns)


def test_a_continuation_of_what_the_session_never_answered_is_refused() -> None:
    with pytest.raises(ValueError, match="resp_elsewhere"):
        model_turns([_connection((_create([_user("x")], "resp_elsewhere"), _answer("resp_1", [SAID])))])


@pytest.mark.parametrize(("produced", "budget"), [(0, 16), (15, 16), (40, 40), (256, 256), (900, 256)])
def test_the_replay_budget_is_what_the_turn_produced_within_bounds(produced: int, budget: int) -> None:
    assert output_budget(produced) == budget
