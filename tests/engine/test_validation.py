"""Malformed requests get a precise 400 naming the offending ``param``."""

from __future__ import annotations

import pytest

from app.engine.validation import decode_json, parse_body
from app.errors import InvalidRequest
from app.protocol.responses import CreateResponseBody


def _error(data: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse_body(CreateResponseBody, data)
    return caught.value


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}, {"type": "bogus"}]}]},
         "input[0].content[1].type", "invalid_type"),
        ({"input": ["ok", {"type": "foo"}]}, "input[0]", "invalid_type"),
        ({"input": [{"role": "user", "content": "hi"}, {"type": "foo"}]}, "input[1].type", "invalid_type"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id",
         "missing_required_parameter"),
        ({"input": [{"role": "user", "content": "x", "extra": 1}]}, "input[0].extra", "unknown_parameter"),
        ({"input": [{"role": "user", "content": "x"}, {"type": "compaction_trigger", "id": "ct_1"}]},
         "input[1].id", "unknown_parameter"),
        ({"input": [{"type": "compaction_trigger", "metadata": {"turn_id": "t"}}]}, "input[0].metadata",
         "unknown_parameter"),
        ({"input": [{"role": "assistant", "content": [{"type": "output_text"}]}]}, "input[0].content[0].text",
         "missing_required_parameter"),
        ({"temperature": "hot"}, "temperature", "invalid_value"),
        ({"temperature": 3}, "temperature", "invalid_value"),
        ({"max_output_tokens": 3}, "max_output_tokens", "invalid_value"),
        ({"tools": [{"type": "function"}]}, "tools[0].name", "missing_required_parameter"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name", "invalid_value"),
        ({"tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
        ({"metadata": {"k": "v" * 513}}, "metadata.k", "string_above_max_length"),
        ({"safety_identifier": "x" * 65}, "safety_identifier", "string_above_max_length"),
        ({"text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema",
         "missing_required_parameter"),
        ({"input": [{"type": "tool_search_call", "arguments": {}, "execution": "elsewhere"}]},
         "input[0].execution", "invalid_value"),
        ({"input": [{"type": "tool_search_call"}]}, "input[0].arguments", "missing_required_parameter"),
        ({"input": [{"type": "tool_search_output", "tools": [1]}]}, "input[0].tools[0]", "invalid_value"),
        ({"input": [{"type": "tool_search_output", "tools": [], "call_id": ""}]}, "input[0].call_id",
         "invalid_value"),
        ({"tools": [{"type": "tool_search", "execution": "client", "name": "x"}]}, "tools[0].name",
         "unknown_parameter"),
        ({"tools": [{"type": "namespace", "name": "n", "defer_loading": "often", "tools": [{"type": "function",
                                                                                          "name": "f"}]}]},
         "tools[0].defer_loading", "invalid_value"),
    ],
)
def test_param_paths(body: dict[str, object], param: str, code: str) -> None:
    error = _error({"model": "m", **body})
    assert (error.param, error.code) == (param, code)
    assert error.status == 400 and error.type == "invalid_request"
    assert param in error.message


# Every discriminated union, with a key that spells like the member's tag: the tag is
# no step of the JSON, the key is.
@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
         "tools[0].name", "missing_required_parameter"),
        ({"tools": [{"type": "function", "name": "f", "function": {"name": "f"}}]},
         "tools[0].function", "unknown_parameter"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice.name",
         "missing_required_parameter"),
        ({"tool_choice": {"type": "allowed_tools", "tools": [{"type": "function", "function": {"name": "f"}}]}},
         "tool_choice.tools[0].name", "missing_required_parameter"),
        ({"tool_choice": {"type": "allowed_tools", "allowed_tools": []}}, "tool_choice.tools",
         "missing_required_parameter"),
        ({"input": [{"type": "function_call", "call_id": "c", "function_call": {"name": "f", "arguments": "{}"}}]},
         "input[0].name", "missing_required_parameter"),
        ({"input": [{"type": "function_call_output", "function_call_output": "x", "call_id": "c"}]},
         "input[0].output", "missing_required_parameter"),
        ({"input": [{"type": "reasoning", "reasoning": "thinking"}]}, "input[0].summary",
         "missing_required_parameter"),
        ({"input": [{"type": "compaction", "compaction": "x"}]}, "input[0].encrypted_content",
         "missing_required_parameter"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "input_text": "hi"}]}]},
         "input[0].content[0].text", "missing_required_parameter"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "input_image": {"url": "x"}}]}]},
         "input[0].content[0].input_image", "unknown_parameter"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "input_file": 5}]}]},
         "input[0].content[0].input_file", "unknown_parameter"),
        ({"input": [{"role": "assistant", "content": [{"type": "output_text", "output_text": "x"}]}]},
         "input[0].content[0].text", "missing_required_parameter"),
        ({"input": [{"role": "assistant", "content": [{"type": "refusal", "refusal": 5}]}]},
         "input[0].content[0].refusal", "invalid_value"),
        ({"input": [{"type": "function_call_output", "call_id": "c",
                     "output": [{"type": "input_text", "input_text": "x"}]}]},
         "input[0].output[0].text", "missing_required_parameter"),
        ({"text": {"format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}}}}},
         "text.format.name", "missing_required_parameter"),
        ({"text": {"format": {"type": "json_object", "json_object": {}}}}, "text.format.json_object",
         "unknown_parameter"),
    ],
)
def test_param_paths_through_every_discriminated_union(body: dict[str, object], param: str, code: str) -> None:
    error = _error({"model": "m", **body})
    assert (error.param, error.code) == (param, code), error.message


def test_a_chat_completions_tool_is_told_that_responses_tools_are_flat() -> None:
    error = _error({"model": "m", "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})
    assert error.param == "tools[0].name"
    assert "flat" in error.message and '{"type": "function", "name": ...' in error.message
    choice = _error({"model": "m", "tool_choice": {"type": "function", "function": {"name": "f"}}})
    assert choice.param == "tool_choice.name" and "flat" in choice.message
    assert "flat" not in _error({"model": "m", "tools": [{"type": "function"}]}).message


def test_body_must_be_an_object() -> None:
    assert _error(["not", "an", "object"]).code == "invalid_type"


def test_broken_json_says_where() -> None:
    with pytest.raises(InvalidRequest) as caught:
        decode_json(b'{"model": "m",, }')
    assert caught.value.code == "invalid_json" and "line 1" in caught.value.message


def test_unknown_top_level_fields_are_ignored_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="ors.request")
    body = parse_body(CreateResponseBody, {"model": "m", "input": "hi", "client_metadata": {"a": 1}})
    assert body.input == "hi"
    assert "client_metadata" in caplog.text


def test_lenient_shapes_the_spec_allows() -> None:
    body = parse_body(
        CreateResponseBody,
        {
            "input": [
                {"role": "system", "content": "be brief"},
                {"role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
                {"role": "user", "content": "hi"},
                {"type": "message", "role": "assistant", "content": "hello", "phase": "commentary"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "x", "annotations": []}],
                 "phase": "final_answer", "id": "msg_1", "status": "completed"},
                {"id": "msg_ref"},
            ]
        },
    )
    assert body.input is not None and len(body.input) == 6
    kinds = [type(item).__name__ for item in body.input]
    assert kinds == [
        "SystemMessageParam", "DeveloperMessageParam", "UserMessageParam",
        "AssistantMessageParam", "AssistantMessageParam", "ItemReferenceParam",
    ]
    assert body.input[3].phase == "commentary"  # type: ignore[union-attr]


def test_lone_surrogates_are_read_as_replacement_characters() -> None:
    body = b'{"input": "a \\ud800 b \\udfff", "\\udc80key": ["\\ud83d\\ude00", "\\\\ud800"]}'
    assert decode_json(body) == {"input": "a \ufffd b \ufffd", "\ufffdkey": ["\U0001f600", "\\ud800"]}
    assert decode_json(body.decode()) == decode_json(body)  # a WebSocket frame is text
    pair_only = b'{"input": "\\ud83d\\ude00"}'
    assert decode_json(pair_only) == {"input": "\U0001f600"}


@pytest.mark.parametrize(("raw", "says"), [
    (b'{"a": NaN}', "NaN is not a JSON number"),
    (b'{"a": [Infinity]}', "Infinity is not a JSON number"),
    (b'{"a": -1e400}', "-1e400 is beyond the range of a double"),
    (b'{"a": ' + b"1" * 4301 + b"}", "more than 4,300 digits"),
    (b'{"a": "\xed\xa0\x80"}', "not valid UTF-8"),  # a surrogate, encoded
    ('{"a": 1}'.encode("utf-16"), "not valid UTF-8"),
])
def test_only_json_as_rfc_8259_has_it(raw: bytes, says: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        decode_json(raw)
    assert caught.value.code == "invalid_json" and says in caught.value.message


def test_what_json_allows_is_read_as_before() -> None:
    assert decode_json(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}  # a byte order mark is ignored
    assert decode_json(b'{"a": 1e-400, "b": 0.5, "c": ' + b"1" * 4300 + b"}") == {"a": 0.0, "b": 0.5, "c": int("1" * 4300)}
    assert decode_json('{"a": "\u00e9"}') == decode_json('{"a": "\u00e9"}'.encode()) == {"a": "\u00e9"}
