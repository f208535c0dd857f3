"""The response builder: every sequence it can produce passes the stream checker, and
illegal moves raise at once."""

from __future__ import annotations

import json
import random

import pytest
from pydantic_core import PydanticSerializationError

from app.backends.base import (
    CompactionDelta,
    Finish,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    ToolSearchCallDelta,
    ToolSearchOutputDelta,
    Usage,
)
from app.engine.builder import IllegalTransition, ResponseBuilder
from app.engine.echo import initial_response
from app.errors import ModelError, StoreUnavailable
from app.protocol.events import ResponseCreated, ResponseInProgress, StreamEvent, serialize_event
from app.protocol.responses import CreateResponseBody
from app.protocol.tools import offered_functions
from compliance import check_stream
from tests.superset import tool_search_spec


def _builder(*, status: str = "in_progress", error_events: bool = True) -> ResponseBuilder:
    body = CreateResponseBody.model_validate({"model": "m", "input": "hi"})
    return ResponseBuilder(
        initial_response(body, response_id="resp_test", model="m", status=status), error_events=error_events
    )


def _wire(events: list) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(serialize_event(event)) for event in events]


def _run(builder: ResponseBuilder, *deltas: object) -> list[dict]:  # type: ignore[type-arg]
    events = builder.start()
    for delta in deltas:
        events += builder.feed(delta)  # type: ignore[arg-type]
    return _wire(events)


def test_mixed_items_stream_in_order() -> None:
    builder = _builder()
    events = _run(
        builder,
        ReasoningDelta("hmm"),
        TextDelta("Let me check."),
        ToolCallDelta(0, name="a", arguments='{"x":'),
        ToolCallDelta(0, arguments="1}"),
        ToolCallDelta(1, name="b", arguments="{}"),
        Finish("tool_calls", Usage(10, 5)),
    )
    final = check_stream([*events, "[DONE]"])
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert final["output"][2]["arguments"] == '{"x":1}'
    assert final["usage"]["total_tokens"] == 15
    assert builder.response.status == "completed"


def test_a_compaction_delta_is_one_whole_compaction_item() -> None:
    builder = _builder()
    events = _run(builder, CompactionDelta("sealed"), Finish("stop", Usage(40, 12)))
    assert [event["type"] for event in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.output_item.done",
        "response.completed"]
    added, done = events[2]["item"], events[3]["item"]
    assert added == {"type": "compaction", "id": added["id"], "encrypted_content": "", "status": "in_progress"}
    assert added["id"].startswith("cmp_")
    assert done == {**added, "encrypted_content": "sealed", "status": "completed"}
    final = check_stream([*events, "[DONE]"])
    assert final["output"] == [done] and final["usage"]["total_tokens"] == 52


def test_a_tool_search_is_two_whole_items() -> None:
    """A search and its output: each ``output_item.added`` with its zero value, then
    ``output_item.done``; the output carries the loaded functions as the request defined
    them (a namespace's inside it), the call's ``call_id`` both times."""
    builder = _offering_builder()
    events = _run(builder, TextDelta("Looking."), ToolSearchCallDelta("call_s", {"query": "files"}),
                  ToolSearchOutputDelta("call_s", ("files__read", "get_weather", "unknown")),
                  ToolCallDelta(0, name="files__read", arguments="{}"), Finish("tool_calls", Usage(9, 3)))
    added = [event["item"] for event in events if event["type"] == "response.output_item.added"]
    assert added[1] == {"type": "tool_search_call", "id": added[1]["id"], "call_id": "call_s", "arguments": {},
                        "execution": "server", "status": "in_progress"}
    assert added[2] == {"type": "tool_search_output", "id": added[2]["id"], "call_id": "call_s",
                        "execution": "server", "tools": [], "status": "in_progress"}
    final = check_stream([*events, "[DONE]"], spec=tool_search_spec())
    message, call, output, read = final["output"]
    assert call["arguments"] == {"query": "files"} and call["status"] == "completed"
    assert output["tools"] == [_TOOLS[2], _TOOLS[0]]  # an unknown name loads nothing
    assert (read["name"], read["namespace"]) == ("read", "files")


def test_a_client_search_always_has_a_call_id() -> None:
    builder = _offering_builder()
    events = _run(builder, ToolSearchCallDelta(None, {"query": "x"}, "client"), Finish("tool_calls"))
    [call] = check_stream([*events, "[DONE]"], spec=tool_search_spec())["output"]
    assert call["call_id"].startswith("call_") and call["execution"] == "client"


def test_length_closes_the_last_item_incomplete() -> None:
    builder = _builder()
    events = _run(builder, TextDelta("abc"), Finish("length"))
    final = check_stream([*events, "[DONE]"])
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][-1]["status"] == "incomplete"


def test_content_filter_reason() -> None:
    final = check_stream([*_run(_builder(), TextDelta("a"), Finish("content_filter")), "[DONE]"])
    assert final["incomplete_details"] == {"reason": "content_filter"}


def test_failure_keeps_partial_output_incomplete() -> None:
    builder = _builder()
    events = builder.start() + builder.feed(TextDelta("half"))
    events += builder.fail(ModelError("boom", code="upstream_unavailable"))
    final = check_stream([*_wire(events), "[DONE]"])
    assert final["status"] == "failed" and final["error"]["code"] == "upstream_unavailable"
    assert final["output"][0]["status"] == "incomplete"


def test_websocket_failure_has_no_error_event() -> None:
    builder = _builder(error_events=False)
    events = builder.start() + builder.fail(ModelError("boom"))
    wire = _wire(events)
    assert [e["type"] for e in wire][-1] == "response.failed"
    check_stream(wire, expect_done=False, transport="websocket")


def test_queued_response_begins_later() -> None:
    builder = _builder(status="queued")
    events = builder.start() + builder.begin() + builder.feed(TextDelta("x")) + builder.feed(Finish("stop"))
    wire = _wire(events)
    assert [e["type"] for e in wire][:3] == ["response.created", "response.queued", "response.in_progress"]
    check_stream([*wire, "[DONE]"])


def test_sequence_numbers_are_consecutive() -> None:
    events = _run(_builder(), TextDelta("a"), TextDelta("b"), Finish("stop"))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


@pytest.mark.parametrize(
    "moves",
    [
        lambda b: b.feed(TextDelta("before start")),
        lambda b: (b.start(), b.start()),
        lambda b: (b.start(), b.feed(Finish("stop")), b.feed(TextDelta("after the end"))),
        lambda b: (b.start(), b.feed(Finish("stop")), b.feed(Finish("stop"))),
        lambda b: (b.start(), b.feed(Finish("stop")), b.fail(ModelError("late"))),
        lambda b: (b.start(), b.feed(ToolCallDelta(0, arguments="{}"))),
        lambda b: (b.start(), b.feed(ToolCallDelta(0, name="a")), b.feed(ToolCallDelta(1, name="b")),
                   b.feed(ToolCallDelta(0, arguments="{}"))),
        lambda b: (b.start(), b.begin()),
    ],
)
def test_illegal_transitions_raise(moves) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(IllegalTransition):
        moves(_builder())


def test_output_items_are_not_mutated_after_they_are_sent() -> None:
    builder = _builder()
    added = builder.start() + builder.feed(TextDelta("x"))
    snapshot = added[2].model_dump_json()
    builder.feed(TextDelta("y"))
    builder.feed(Finish("stop"))
    assert added[2].model_dump_json() == snapshot


# ---------------------------------------------------------------- logprobs


def _logprob_builder(*, logprobs: bool) -> ResponseBuilder:
    body = CreateResponseBody.model_validate({"model": "m", "input": "hi"})
    return ResponseBuilder(initial_response(body, response_id="resp_test", model="m"), logprobs=logprobs)


def _lp(token: str, logprob: float, *top: TokenLogprob) -> TokenLogprob:
    return TokenLogprob(token, logprob, token.encode(), top)


def test_logprobs_go_on_the_deltas_the_done_events_and_the_part() -> None:
    alternative = _lp("Hey", -1.5)
    events = _run(
        _logprob_builder(logprobs=True),
        TextDelta("Hi", (_lp("Hi", -0.25, alternative),)),
        TextDelta("", (_lp("", -0.5),)),  # a token that completed no character
        TextDelta(" there", (_lp(" there", float("-inf")),)),
        Finish("stop"),
    )
    final = check_stream([*events, "[DONE]"])
    deltas = [e["logprobs"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == [
        [{"token": "Hi", "logprob": -0.25, "bytes": [72, 105],
          "top_logprobs": [{"token": "Hey", "logprob": -1.5, "bytes": [72, 101, 121]}]}],
        [{"token": "", "logprob": -0.5, "bytes": [], "top_logprobs": []},
         {"token": " there", "logprob": -9999.0, "bytes": list(b" there"), "top_logprobs": []}],
    ]  # fmt: skip
    whole = deltas[0] + deltas[1]
    [done] = [e for e in events if e["type"] == "response.output_text.done"]
    [part_done] = [e for e in events if e["type"] == "response.content_part.done"]
    [part_added] = [e for e in events if e["type"] == "response.content_part.added"]
    assert done["logprobs"] == part_done["part"]["logprobs"] == whole
    assert part_added["part"]["logprobs"] == []
    assert final["output"][0]["content"][0]["logprobs"] == whole


def test_asked_but_none_sent_is_an_empty_list() -> None:
    events = _run(_logprob_builder(logprobs=True), TextDelta("Hi"), Finish("stop"))
    final = check_stream([*events, "[DONE]"])
    assert [e["logprobs"] for e in events if e["type"] == "response.output_text.delta"] == [[]]
    assert final["output"][0]["content"][0]["logprobs"] == []


def test_without_asking_no_logprobs_field_anywhere() -> None:
    events = _run(_logprob_builder(logprobs=False), TextDelta("Hi", (_lp("Hi", -0.25),)), Finish("stop"))
    check_stream([*events, "[DONE]"])
    assert "logprobs" not in _keys(events)


def _keys(value: object) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {key for inner in value.values() for key in _keys(inner)}
    if isinstance(value, list):
        return {key for inner in value for key in _keys(inner)}
    return set()


def test_a_failed_response_keeps_the_partial_logprobs() -> None:
    builder = _logprob_builder(logprobs=True)
    events = builder.start() + builder.feed(TextDelta("half", (_lp("half", -0.1),)))
    events += builder.fail(ModelError("boom"))
    final = check_stream([*_wire(events), "[DONE]"])
    assert [lp["token"] for lp in final["output"][0]["content"][0]["logprobs"]] == ["half"]


@pytest.mark.parametrize("error_events", [True, False], ids=["sse", "websocket"])
def test_a_completed_end_that_was_not_recorded_is_taken_back_and_fails(error_events: bool) -> None:
    builder = _builder(error_events=error_events)
    events = builder.start() + builder.feed(TextDelta("kept")) + builder.feed(Finish("stop"))
    assert builder.response.status == "completed"
    events.pop()  # the terminal event, never sent
    events += builder.unrecorded(StoreUnavailable("The response store cannot be reached."))
    final = check_stream([*_wire(events), "[DONE]"], transport="sse" if error_events else "websocket")
    assert final["status"] == "failed" and final["completed_at"] is None
    assert final["error"] == {"code": "store_unavailable", "message": "The response store cannot be reached."}
    assert [part["text"] for part in final["output"][0]["content"]] == ["kept"]
    assert [event.sequence_number for event in events] == list(range(len(events)))


def test_only_a_completed_end_can_be_taken_back() -> None:
    builder = _builder()
    builder.start()
    with pytest.raises(IllegalTransition):
        builder.unrecorded(StoreUnavailable("x"))  # still running
    cut = _builder()
    cut.start()
    cut.feed(TextDelta("cut"))
    cut.feed(Finish("length"))
    with pytest.raises(IllegalTransition):
        cut.unrecorded(StoreUnavailable("x"))  # its item was closed incomplete
    builder.fail(ModelError("the model failed"))
    with pytest.raises(IllegalTransition):
        builder.unrecorded(StoreUnavailable("x"))  # failed already: nothing better to say


# ---------------------------------------------------------------- a builder without events


_ENDINGS = {
    "completed": (ReasoningDelta("hmm"), TextDelta("Let me check."), ToolCallDelta(0, name="a", arguments='{"x":'),
                  ToolCallDelta(0, arguments="1}"), ToolCallDelta(1, name="b", arguments="{}"),
                  Finish("tool_calls", Usage(10, 5))),
    "incomplete": (TextDelta("abc"), Finish("length", Usage(3, 1))),
    "empty": (Finish("stop"),),
}


def _ids_blanked(value: object) -> object:
    """``value`` with every id (random) replaced by its prefix, so two runs compare."""
    if isinstance(value, dict):
        return {key: (item.split("_")[0] if key in ("id", "call_id") else _ids_blanked(item))
                for key, item in value.items() if key not in ("created_at", "completed_at")}
    if isinstance(value, list):
        return [_ids_blanked(item) for item in value]
    return value


def _silent() -> ResponseBuilder:
    body = CreateResponseBody.model_validate({"model": "m", "input": "hi"})
    return ResponseBuilder(initial_response(body, response_id="resp_test", model="m", status="in_progress"),
                           events=False)


@pytest.mark.parametrize("ending", list(_ENDINGS))
def test_a_builder_without_events_builds_the_same_response(ending: str) -> None:
    loud, silent = _builder(), _silent()
    wire = _run(loud, *_ENDINGS[ending])
    events = silent.start()
    for delta in _ENDINGS[ending]:
        events += silent.feed(delta)
    assert events == []
    check_stream([*wire, "[DONE]"])
    assert _ids_blanked(json.loads(silent.response.model_dump_json())) == _ids_blanked(
        json.loads(loud.response.model_dump_json()))


def test_a_builder_without_events_fails_and_takes_back_an_end_as_any_other() -> None:
    silent = _silent()
    assert silent.start() + silent.feed(TextDelta("kept")) + silent.feed(Finish("stop")) == []
    assert silent.unrecorded(StoreUnavailable("The response store cannot be reached.")) == []
    assert silent.response.status == "failed" and silent.response.error is not None
    assert silent.response.error.code == "store_unavailable"
    assert silent.response.output[0].content[0].text == "kept"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "moves",
    [
        lambda b: (b.start(), b.feed(Finish("stop")), b.feed(TextDelta("after the end"))),
        lambda b: (b.start(), b.feed(ToolCallDelta(0, arguments="{}"))),
        lambda b: (b.start(), b.feed(ToolCallDelta(0, name="a")), b.feed(ToolCallDelta(1, name="b")),
                   b.feed(ToolCallDelta(0, arguments="{}"))),
    ],
    ids=["after-the-end", "call-without-name", "call-continued-after-close"],
)
def test_a_builder_without_events_refuses_what_any_builder_refuses(moves) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(IllegalTransition):
        moves(_silent())


def _random_text(rng: random.Random) -> str:
    """Text of every kind a model sends: ASCII, quotes and backslashes, control
    characters, the line separators JSON keeps raw, accents, CJK, emoji."""
    pools = [(0x20, 0x7E), (0x00, 0x1F), (0x7F, 0xA0), (0xA1, 0x2FF), (0x2028, 0x2029), (0x4E00, 0x4FFF),
             (0x1F600, 0x1F64F), (0xE000, 0xE0FF), (0xFFF0, 0xFFFF)]
    chars = []
    for _ in range(rng.randint(0, 12)):
        low, high = rng.choice(pools)
        chars.append(chr(rng.randint(low, high)))
    return "".join(chars) + rng.choice(["", '"', "\\", "\n", "\t", "</script>"])


def test_a_text_delta_with_a_lone_surrogate_cannot_be_serialized() -> None:
    builder = _builder()
    events = builder.start() + builder.feed(TextDelta("cut \ud83d"))
    with pytest.raises(PydanticSerializationError):
        serialize_event(events[-1])


# ---------------------------------------------------------------- events and their JSON


_TOOLS = [
    {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    {"type": "custom", "name": "apply_patch"},
    {"type": "namespace", "name": "files", "tools": [{"type": "function", "name": "read", "parameters": {}}]},
]


def _offering_builder(*, status: str = "in_progress", logprobs: bool = False,
                      error_events: bool = True) -> ResponseBuilder:
    body = CreateResponseBody.model_validate({"model": "m", "input": "hi", "tools": _TOOLS})
    offered = {function.name: function for function in offered_functions(body.tools)}
    return ResponseBuilder(initial_response(body, response_id="resp_w", model="m", status=status),
                           logprobs=logprobs, offered=offered, error_events=error_events)


def _lp_random(rng: random.Random) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(_random_text(rng), rng.choice([-0.0, -1e-9, -2.5, -float("inf")]), ())
                 for _ in range(rng.randint(0, 2)))


def _scenario(rng: random.Random) -> list[object]:
    """One random life of a builder: its events, whatever they are."""
    logprobs = rng.random() < 0.4
    builder = _offering_builder(status=rng.choice(["in_progress", "queued"]), logprobs=logprobs,
                                error_events=rng.random() < 0.7)
    events = builder.start()
    if builder.status == "queued":
        events += builder.begin()
    call = 0
    for _ in range(rng.randint(0, 8)):
        kind = rng.random()
        if kind < 0.35:
            events += builder.feed(TextDelta(_random_text(rng), _lp_random(rng) if logprobs else ()))
        elif kind < 0.55:
            events += builder.feed(ReasoningDelta(_random_text(rng)))
        elif kind < 0.6:
            events += builder.feed(CompactionDelta(_random_text(rng)))
        elif kind < 0.65:
            events += builder.feed(ToolSearchCallDelta(rng.choice([None, "call_s"]), {"query": _random_text(rng)},
                                                       rng.choice(["server", "client"])))
            events += builder.feed(ToolSearchOutputDelta("call_s", ("get_weather", "files__read")[:rng.randint(0, 2)]))
        else:
            name = rng.choice(["get_weather", "apply_patch", "files__read"])
            events += builder.feed(ToolCallDelta(call, name=name, arguments=rng.choice(['{"a":', "", '"x"'])))
            events += builder.feed(ToolCallDelta(call, arguments=rng.choice(["1}", "", _random_text(rng)])))
            call += 1
    ending = rng.choice(["stop", "length", "tool_calls", "fail", "cancel", "disconnect", "unrecorded"])
    if ending in ("stop", "length", "tool_calls"):
        events += builder.feed(Finish(ending, Usage(rng.randint(0, 99), rng.randint(0, 99))))
    elif ending == "fail":
        events += builder.fail(ModelError(_random_text(rng) or "broke", code="upstream_error"))
    elif ending == "cancel":
        events += builder.cancel()
    elif ending == "disconnect":
        events += builder.stop("client_disconnected")
    else:  # the end, taken back (never sent) as it could not be recorded
        events += builder.feed(Finish("stop"))[:-1]
        events += builder.unrecorded(StoreUnavailable("The response store cannot be reached."))
    return events


def test_every_event_is_serialized_as_its_wire_model_writes_it() -> None:
    """Over random lives of a builder (text with and without logprobs, reasoning,
    function, custom and namespace calls, every ending), each event is its validated
    wire model (compaction items too), :func:`serialize_event` writes what that model writes, and the JSON reads
    back to the same event; every kind of event the builder makes is seen."""
    rng = random.Random(5)
    seen = set()
    for _ in range(400):
        events = _scenario(rng)
        for event in events:
            assert isinstance(event, StreamEvent)
            seen.add(type(event))
            data = serialize_event(event)
            assert data == event.model_dump_json(), type(event)
            assert serialize_event(type(event).model_validate_json(data)) == data
        wire = [json.loads(serialize_event(event)) for event in events]  # type: ignore[arg-type]
        if "custom_tool_call" not in json.dumps(wire):  # OpenAI's item, outside the spec's variants
            check_stream([*wire, "[DONE]"], spec=tool_search_spec())
    assert {kind.__name__ for kind in seen} >= {
        "ResponseCreated", "ResponseQueued", "ResponseInProgress", "ResponseCompleted", "ResponseIncomplete",
        "ResponseFailed", "OutputItemAdded", "OutputItemDone", "ContentPartAdded", "ContentPartDone",
        "OutputTextDelta", "OutputTextDone", "ReasoningDone", "ReasoningDelta", "FunctionCallArgumentsDelta",
        "FunctionCallArgumentsDone", "ErrorEvent"}


def test_a_response_event_carries_the_builders_snapshot() -> None:
    builder = _builder()
    created, in_progress = builder.start()
    assert isinstance(created, ResponseCreated) and created.response is builder.response
    assert isinstance(in_progress, ResponseInProgress) and in_progress.response is builder.response
