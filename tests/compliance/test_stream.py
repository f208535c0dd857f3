from __future__ import annotations

import copy

import pytest
from stream_factory import StreamBuilder, make_response, to_sse

from compliance import ConformanceError, StreamChecker, check_sse_body, check_sse_chunks, check_stream
from tests.superset import tool_search_spec


def raises(match: str):
    return pytest.raises(ConformanceError, match=match)


def run(events, **options):
    """Feed events through a fresh checker and return the final response."""
    checker = StreamChecker(**options)
    for event in events:
        checker.feed(event)
    return checker.finish()


def text_stream() -> StreamBuilder:
    builder = StreamBuilder()
    builder.message(["Hel", "lo", "!"])
    builder.completed()
    return builder


def find(events, event_type, occurrence=0):
    """The index of the n-th event of ``event_type``."""
    return [i for i, event in enumerate(events) if event["type"] == event_type][occurrence]


def renumber(events):
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


# Valid streams


def test_text_message_stream():
    builder = text_stream()
    final = check_stream([*builder.events, "[DONE]"])
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "Hello!"


def test_function_call_stream():
    builder = StreamBuilder()
    builder.function_call(['{"location":', ' "Paris"}'])
    builder.completed()
    assert run(builder.events)["output"][0]["arguments"] == '{"location": "Paris"}'


def test_reasoning_then_message_stream():
    builder = StreamBuilder()
    builder.reasoning(["Think", "ing"], ["raw ", "trace"])
    builder.message(["Answer"], item_id="msg_2")
    builder.completed()
    final = run(builder.events)
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]


def test_refusal_stream():
    builder = StreamBuilder()
    builder.message(["I can", "not"], kind="refusal")
    builder.completed()
    run(builder.events)


def test_parallel_function_calls_are_consecutive_items():
    builder = StreamBuilder()
    builder.function_call(["{}"], item_id="fc_1", call_id="call_1")
    builder.function_call(["{}"], item_id="fc_2", call_id="call_2")
    builder.completed()
    assert len(run(builder.events)["output"]) == 2


def test_incomplete_response():
    builder = StreamBuilder()
    builder.message(["Cut"], status="incomplete")
    builder.incomplete()
    assert run(builder.events)["incomplete_details"] == {"reason": "max_output_tokens"}


def test_failed_response_after_error_event():
    builder = StreamBuilder()
    builder.message(["Partial"])
    builder.error()
    builder.failed()
    assert run(builder.events)["status"] == "failed"


def test_failed_response_may_drop_an_unfinished_item():
    builder = StreamBuilder()
    builder.emit("response.output_item.added", output_index=0, item={
        "id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []})
    builder.error()
    builder.failed()
    run(builder.events)


def test_queued_response_and_any_starting_sequence_number():
    builder = StreamBuilder(start=17, created_status="queued")
    builder.message(["ok"])
    builder.completed()
    run(builder.events)


def test_annotations_and_logprobs_accumulate():
    builder = StreamBuilder()
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    item = {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
    logprob = {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}
    annotation = {"type": "url_citation", "url": "https://example.com", "start_index": 0, "end_index": 2,
                  "title": "Example"}
    builder.emit("response.output_item.added", output_index=0, item=item)
    builder.emit("response.content_part.added", **where, part={"type": "output_text", "text": "", "annotations": []})
    builder.emit("response.output_text.delta", **where, delta="Hi", logprobs=[logprob])
    builder.emit("response.output_text.annotation.added", **where, annotation_index=0, annotation=annotation)
    builder.emit("response.output_text.done", **where, text="Hi", logprobs=[logprob])
    part = {"type": "output_text", "text": "Hi", "annotations": [annotation], "logprobs": [logprob]}
    builder.emit("response.content_part.done", **where, part=part)
    done = {**item, "status": "completed", "content": [part]}
    builder.emit("response.output_item.done", output_index=0, item=done)
    builder.items.append(done)
    builder.completed()
    run(builder.events)


def test_websocket_turn_has_no_done():
    assert check_stream(text_stream().events, expect_done=False, transport="websocket")["status"] == "completed"


def test_sse_body_and_chunks():
    body = to_sse(text_stream().events)
    assert check_sse_body(body)["status"] == "completed"
    assert check_sse_chunks(body[i:i + 7] for i in range(0, len(body), 7))["status"] == "completed"


def test_schema_validation_can_be_disabled():
    run(text_stream().events, validate_schemas=False)


# Violations


def test_missing_done_in_sse_body():
    with raises(r"does not end with 'data: \[DONE\]'"):
        check_sse_body(to_sse(text_stream().events, done=False))
    with raises(r"does not end with \[DONE\]"):
        check_stream(text_stream().events)


def test_done_on_websocket():
    with raises(r"\[DONE\] appears on this transport"):
        check_stream([*text_stream().events, "[DONE]"], expect_done=False, transport="websocket")


def test_id_line_and_name_mismatch_in_sse_body():
    body = to_sse(text_stream().events)
    with raises("'id:'"):
        check_sse_body(body.replace(b"event: response.created\n", b"event: response.created\nid: 1\n", 1))
    with raises("differs from the JSON type"):
        check_sse_body(body.replace(b"event: response.in_progress\n", b"event: response.created\n", 1))


def test_crlf_sse_body():
    with raises("carriage return"):
        check_sse_body(to_sse(text_stream().events, newline="\r\n"))


def test_sequence_gap():
    events = text_stream().events
    for event in events[3:]:
        event["sequence_number"] += 1
    with raises(r"event #3 .*sequence_number jumps from 2 to 4"):
        run(events)


def test_sequence_not_increasing():
    events = text_stream().events
    events[2]["sequence_number"] = 1
    with raises("sequence_number 1 does not increase"):
        run(events)


def test_first_event_must_be_created():
    events = renumber(text_stream().events[1:])
    with raises("the first event must be 'response.created'"):
        run(events)


def test_queued_only_after_a_queued_creation():
    events = text_stream().events
    events.insert(1, {"type": "response.queued", "sequence_number": 0, "response": make_response(status="queued")})
    with raises("'response.queued' is allowed only when the created snapshot is queued"):
        run(renumber(events))


def test_snapshot_must_have_empty_output_and_null_usage():
    events = text_stream().events
    events[1]["response"]["usage"] = events[-1]["response"]["usage"]
    with raises(r"'response.in_progress' must carry usage: null \(at \$\.response\.usage\)"):
        run(events)


def test_item_done_twice():
    events = text_stream().events
    index = find(events, "response.output_item.done")
    events.insert(index + 1, copy.deepcopy(events[index]))
    with raises("output_item.done for item 'msg_1' was already sent"):
        run(renumber(events))


def test_delta_after_item_done():
    events = text_stream().events
    delta = copy.deepcopy(events[find(events, "response.output_text.delta")])
    events.insert(find(events, "response.output_item.done") + 1, delta)
    with raises("an event for item 'msg_1' after its output_item.done"):
        run(renumber(events))


def test_delta_after_text_done():
    events = text_stream().events
    delta = copy.deepcopy(events[find(events, "response.output_text.delta")])
    events.insert(find(events, "response.output_text.done") + 1, delta)
    with raises("a delta after the output_text text is done"):
        run(renumber(events))


def test_mismatched_done_text():
    events = text_stream().events
    events[find(events, "response.output_text.done")]["text"] = "Hello?"
    with raises(r"the done text 'Hello\?' differs from the concatenated deltas 'Hello!'"):
        run(events)


def test_mismatched_content_part_done():
    events = text_stream().events
    events[find(events, "response.content_part.done")]["part"]["text"] = "Bye"
    with raises(r"the done part differs from the streamed part: \.text is 'Bye', streamed 'Hello!'"):
        run(events)


def test_mismatched_item_done_content():
    events = text_stream().events
    events[find(events, "response.output_item.done")]["item"]["content"][0]["text"] = "Bye"
    with raises("content differs from the streamed parts"):
        run(events)


def test_final_output_differs_from_streamed_item():
    events = text_stream().events
    events[-1]["response"]["output"][0]["id"] = "msg_other"
    with raises(r"the final output item 0 differs from the streamed item: \.id is 'msg_other'"):
        run(events)


def test_final_output_has_extra_item():
    events = text_stream().events
    events[-1]["response"]["output"].append(copy.deepcopy(events[-1]["response"]["output"][0]))
    events[-1]["response"]["output"][1]["id"] = "msg_2"
    with raises("the final response has 2 output items but 1 were streamed"):
        run(events)


def test_missing_terminal():
    with raises("ended without a terminal event"):
        run(text_stream().events[:-1])


def test_two_terminal_events():
    events = text_stream().events
    events.append(copy.deepcopy(events[-1]))
    with raises("a second terminal event after the terminal event"):
        run(renumber(events))


def test_error_without_response_failed():
    builder = StreamBuilder()
    builder.error()
    with raises("after an 'error' event without 'response.failed'"):
        run(builder.events)
    builder.message(["late"])
    with raises("an 'error' event must be followed immediately by 'response.failed'"):
        run(builder.events)


def test_error_event_on_websocket():
    builder = StreamBuilder()
    builder.error()
    builder.failed()
    with raises("a WebSocket stream must not carry an 'error' event"):
        run(builder.events, transport="websocket")


def test_incomplete_item_not_last():
    builder = StreamBuilder()
    builder.message(["Cut"], status="incomplete")
    builder.message(["More"], item_id="msg_2")
    builder.incomplete()
    with raises("follows an incomplete item; an incomplete item must be the last"):
        run(builder.events)


def test_incomplete_item_needs_response_incomplete():
    builder = StreamBuilder()
    builder.message(["Cut"], status="incomplete")
    builder.completed()
    with raises("a stream with an incomplete item must end with 'response.incomplete'"):
        run(builder.events)


def test_incomplete_response_needs_a_reason():
    builder = StreamBuilder()
    builder.message(["Cut"], status="incomplete")
    builder.incomplete()
    builder.events[-1]["response"]["incomplete_details"] = None
    with raises("an incomplete response must set incomplete_details.reason"):
        run(builder.events)


def test_terminal_status_must_match_event():
    events = text_stream().events
    events[-1]["response"]["status"] = "incomplete"
    with raises("'response.completed' carries a response with status 'incomplete'"):
        run(events)


def test_schema_invalid_event():
    events = text_stream().events
    del events[-1]["response"]["top_logprobs"]
    with raises(r"'response.completed' event is invalid at \$\.response: 'top_logprobs' is a required property"):
        run(events)


def test_added_item_must_be_in_progress_with_zero_values():
    events = text_stream().events
    index = find(events, "response.output_item.added")
    events[index]["item"]["status"] = "completed"
    with raises("an added item must have status 'in_progress'"):
        run(events)
    events = text_stream().events
    events[index]["item"]["content"] = [{"type": "output_text", "text": "x", "annotations": []}]
    with raises(r"an added message must carry content: \[\]"):
        run(events)


def test_a_compaction_item_streams_with_no_deltas():
    builder = StreamBuilder()
    item = builder.compaction("sealed-summary")
    builder.completed()
    assert run(builder.events)["output"] == [item]


def test_an_added_compaction_item_must_carry_no_content():
    builder = StreamBuilder()
    builder.compaction("sealed-summary")
    builder.completed()
    events = builder.events
    events[find(events, "response.output_item.added")]["item"]["encrypted_content"] = "sealed-summary"
    with raises(r"an added compaction must carry encrypted_content: ''"):
        run(events)


WEATHER_TOOL = {"type": "function", "name": "get_weather", "defer_loading": True,
                "parameters": {"type": "object", "properties": {}}}


def test_tool_search_items_stream_whole_under_the_superset_spec():
    builder = StreamBuilder()
    call, output = builder.tool_search({"query": "weather"}, [WEATHER_TOOL])
    builder.function_call(['{"city": "Paris"}'])
    builder.completed()
    assert run(builder.events, spec=tool_search_spec())["output"][:2] == [call, output]
    with raises("tool_search_call"):  # not an item of the spec itself
        run(builder.events)


def test_added_tool_search_items_must_carry_zero_values():
    for position, field, value, message in (
            (0, "arguments", {"query": "weather"}, r"an added tool_search_call must carry arguments: \{\}"),
            (1, "tools", [WEATHER_TOOL], r"an added tool_search_output must carry tools: \[\]")):
        builder = StreamBuilder()
        builder.tool_search({"query": "weather"}, [WEATHER_TOOL])
        builder.completed()
        events = builder.events
        events[find(events, "response.output_item.added", position)]["item"][field] = value
        with raises(message):
            run(events, spec=tool_search_spec())


def test_a_done_tool_search_output_must_keep_its_call_id():
    builder = StreamBuilder()
    builder.tool_search({"query": "weather"}, [WEATHER_TOOL])
    builder.completed()
    events = builder.events
    events[find(events, "response.output_item.done", 1)]["item"]["call_id"] = "call_other"
    with raises("call_id 'call_other' differs"):
        run(events, spec=tool_search_spec())


def test_a_compaction_item_takes_no_content_parts():
    builder = StreamBuilder()
    builder.compaction()
    builder.completed()
    events = builder.events
    events.insert(find(events, "response.output_item.done"), {
        "type": "response.content_part.added", "sequence_number": 0, "item_id": "cmp_1", "output_index": 0,
        "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})
    with raises("a compaction item cannot stream a 'output_text' part"):
        run(renumber(events))


def test_item_added_while_previous_open():
    builder = StreamBuilder()
    builder.message(["one"])
    events = builder.events
    events.insert(find(events, "response.output_item.done"), {
        "type": "response.output_item.added", "sequence_number": 0, "output_index": 1,
        "item": {"id": "msg_2", "type": "message", "status": "in_progress", "role": "assistant", "content": []}})
    with raises("item 1 is added while item 0 is still open"):
        run(renumber(events))


def test_output_index_must_be_consecutive():
    events = text_stream().events
    for event in events:
        if "output_index" in event:
            event["output_index"] = 1
    with raises("output_index 1; the next item must have output_index 0"):
        run(events)


def test_item_id_must_match():
    events = text_stream().events
    events[find(events, "response.output_text.delta")]["item_id"] = "msg_other"
    with raises("item_id 'msg_other' is not the id 'msg_1' of item 0"):
        run(events)


def test_content_index_must_be_consecutive():
    events = text_stream().events
    for event in events:
        if "content_index" in event:
            event["content_index"] = 1
    with raises("content_index 1; the next part is 0"):
        run(events)


def test_delta_of_the_wrong_kind():
    events = text_stream().events
    events[find(events, "response.output_text.delta")]["type"] = "response.refusal.delta"
    with raises("a refusal event inside a 'output_text' part"):
        run(events)


def test_arguments_events_only_for_function_calls():
    events = text_stream().events
    events.insert(find(events, "response.output_item.done"), {
        "type": "response.function_call_arguments.delta", "sequence_number": 0, "item_id": "msg_1",
        "output_index": 0, "delta": "{"})
    with raises("function-call arguments for a message item"):
        run(renumber(events))


def test_function_call_done_arguments_must_match():
    builder = StreamBuilder()
    builder.function_call(["{}"])
    builder.completed()
    builder.events[find(builder.events, "response.output_item.done")]["item"]["arguments"] = '{"a": 1}'
    with raises("arguments '{\"a\": 1}' differ from the streamed arguments '{}'"):
        run(builder.events)


def test_text_part_closed_before_its_text_done():
    events = text_stream().events
    del events[find(events, "response.output_text.done")]
    with raises("the part is closed before its output_text text is done"):
        run(renumber(events))


def test_item_done_while_part_open():
    events = text_stream().events
    del events[find(events, "response.content_part.done")]
    with raises("output_item.done while a part of the item is still open"):
        run(renumber(events))


def test_response_id_must_be_stable():
    events = text_stream().events
    events[1]["response"]["id"] = "resp_other"
    with raises("response.id changed within the stream"):
        run(events)


def test_item_needs_status():
    builder = StreamBuilder()
    builder.reasoning(["s"], ["c"])
    builder.completed()
    del builder.events[find(builder.events, "response.output_item.added")]["item"]["status"]
    with raises(r"every item must have a non-empty 'status' \(at \$\.item\.status\)"):
        run(builder.events)


def test_mcp_events_only_for_their_items():
    """OpenAI's MCP events (a superset the checker knows) must name an open item of their kind."""
    for event_type, label in (("response.mcp_call.in_progress", "'response.mcp_call.in_progress' for a message"),
                              ("response.mcp_list_tools.completed", "for a message item")):
        events = text_stream().events
        events.insert(find(events, "response.output_item.done"), {
            "type": event_type, "sequence_number": 0, "item_id": "msg_1", "output_index": 0})
        with raises(label):
            run(renumber(events), validate_schemas=False)
    events = text_stream().events
    events.insert(find(events, "response.output_item.done"), {
        "type": "response.mcp_call_arguments.delta", "sequence_number": 0, "item_id": "msg_1",
        "output_index": 0, "delta": "{"})
    with raises("mcp-call arguments for a message item"):
        run(renumber(events), validate_schemas=False)
