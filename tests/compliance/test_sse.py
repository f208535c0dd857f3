from __future__ import annotations

import pytest
from stream_factory import StreamBuilder, to_sse

from compliance import ConformanceError, SSEParser, parse_sse


def raises(match: str):
    return pytest.raises(ConformanceError, match=match)


def sample_events():
    builder = StreamBuilder()
    builder.message(["Hel", "lo"])
    builder.completed()
    return builder.events


def test_well_framed_body_parses():
    events = sample_events()
    assert parse_sse(to_sse(events)) == events


def test_comments_and_extra_blank_lines_are_keep_alives():
    events = sample_events()
    body = b": keep-alive\n\n" + to_sse(events[:2], done=False) + b"\n: ping\n\n" + to_sse(events[2:])
    assert parse_sse(body) == events


def test_a_value_without_the_optional_space_is_accepted():
    assert parse_sse(b'event:error\ndata:{"type":"error"}\n\ndata: [DONE]\n\n') == [{"type": "error"}]


def test_incremental_feeding_byte_by_byte():
    events = sample_events()
    parser = SSEParser()
    received = []
    for byte in to_sse(events):
        received.extend(parser.feed(bytes([byte])))
    assert parser.close() == events == received
    assert parser.done


def test_missing_done():
    with raises(r"does not end with 'data: \[DONE\]'"):
        parse_sse(to_sse(sample_events(), done=False))


def test_done_is_optional_when_not_required():
    assert parse_sse(to_sse(sample_events(), done=False), require_done=False) == sample_events()


def test_id_line_is_rejected():
    body = b'event: error\nid: 7\ndata: {"type":"error"}\n\ndata: [DONE]\n\n'
    with raises("line 2: servers must not send an SSE 'id:' field"):
        parse_sse(body)


def test_event_name_must_equal_json_type():
    body = b'event: response.created\ndata: {"type":"response.in_progress"}\n\ndata: [DONE]\n\n'
    with raises("event name 'response.created' differs from the JSON type 'response.in_progress'"):
        parse_sse(body)


def test_crlf_framing_is_rejected():
    with raises("line 1 contains a carriage return"):
        parse_sse(to_sse(sample_events(), newline="\r\n"))


def test_mixed_line_endings_are_rejected():
    body = to_sse(sample_events()[:1], done=False) + b'event: error\r\ndata: {"type":"error"}\n\ndata: [DONE]\n\n'
    with raises("line 4 contains a carriage return"):
        parse_sse(body)


def test_data_without_event_line_is_rejected():
    with raises(r"has fields \['data'\]; expected one 'event:' line then one 'data:' line"):
        parse_sse(b'data: {"type":"error"}\n\ndata: [DONE]\n\n')


def test_data_before_event_line_is_rejected():
    with raises(r"has fields \['data', 'event'\]"):
        parse_sse(b'data: {"type":"error"}\nevent: error\n\ndata: [DONE]\n\n')


def test_multiple_data_lines_are_rejected():
    with raises("more than one 'data:' line"):
        parse_sse(b'event: error\ndata: {"type":\ndata: "error"}\n\ndata: [DONE]\n\n')


def test_unknown_field_is_rejected():
    with raises("unexpected SSE field 'retry'"):
        parse_sse(b'retry: 10\nevent: error\ndata: {"type":"error"}\n\ndata: [DONE]\n\n')


def test_invalid_json_and_non_objects_are_rejected():
    with raises("is not valid JSON"):
        parse_sse(b"event: error\ndata: {nope\n\ndata: [DONE]\n\n")
    with raises("must be a JSON object"):
        parse_sse(b'event: error\ndata: ["error"]\n\ndata: [DONE]\n\n')


def test_anything_after_done_is_rejected():
    with raises(r"data after 'data: \[DONE\]'"):
        parse_sse(to_sse(sample_events()) + b": late comment\n\n")
    parser = SSEParser()
    parser.feed(to_sse(sample_events()))
    with raises(r"data after 'data: \[DONE\]'"):
        parser.feed(b"\n")


def test_done_with_an_event_line_is_rejected():
    with raises(r"'data: \[DONE\]' must be a block of its own"):
        parse_sse(b"event: done\ndata: [DONE]\n\n")


def test_unterminated_final_block_is_rejected():
    with raises("ends inside a block"):
        parse_sse(to_sse(sample_events(), done=False) + b"data: [DONE]\n")
    with raises("unterminated line"):
        parse_sse(to_sse(sample_events(), done=False) + b"data: [DONE]")


def test_block_aligned_chunks_flags_a_split_event():
    body = to_sse(sample_events())
    parser = SSEParser(block_aligned_chunks=True)
    first_block_end = body.index(b"\n\n") + 2
    parser.feed(body[:first_block_end])
    with raises("a network chunk ended inside an SSE block"):
        parser.feed(body[first_block_end:first_block_end + 10])
