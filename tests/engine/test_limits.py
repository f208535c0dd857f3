"""app.engine.limits and the depth check of decode_json."""

from __future__ import annotations

import json

import pytest

from app.engine.limits import RequestLimits, check_counts, check_json_shape
from app.engine.validation import decode_json
from app.errors import InvalidRequest


def test_depth_counts_objects_and_arrays() -> None:
    check_json_shape({"a": [{"b": 1}]}, b"", 3, 100)
    with pytest.raises(InvalidRequest) as caught:
        check_json_shape({"a": [{"b": [1]}]}, b'{"a": [{"b": [1]}]}', 3, 100)
    assert (caught.value.code, caught.value.param) == ("json_too_deep", "a")
    check_json_shape("x" * 1000, b"", 1, 1)


def test_decode_json_refuses_deep_bodies_with_the_field() -> None:
    raw = json.dumps({"model": "m", "input": [[[[["x"]]]]]}).encode()
    assert decode_json(raw, RequestLimits(max_json_depth=10))["model"] == "m"
    with pytest.raises(InvalidRequest) as caught:
        decode_json(raw, RequestLimits(max_json_depth=4))
    assert (caught.value.code, caught.value.param) == ("json_too_deep", "input")


def test_decode_json_beyond_the_interpreter_stack_is_a_400() -> None:
    raw = b'{"input": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with pytest.raises(InvalidRequest) as caught:
        decode_json(raw, RequestLimits(max_json_depth=128))
    assert (caught.value.code, caught.value.param) == ("json_too_deep", "input")


def test_a_bracket_inside_a_string_is_not_nesting() -> None:
    raw = json.dumps({"text": "[[[[[[[[", "input": [[["x"]]]}).encode()
    with pytest.raises(InvalidRequest) as caught:
        decode_json(raw, RequestLimits(max_json_depth=3))
    assert caught.value.param == "input"


def test_counts() -> None:
    limits = RequestLimits(max_input_items=2, max_tools=1)
    check_counts({"input": [1, 2], "tools": [1]}, limits)
    with pytest.raises(InvalidRequest) as caught:
        check_counts({"input": [1, 2, 3]}, limits)
    assert (caught.value.code, caught.value.param) == ("too_many_input_items", "input")
    with pytest.raises(InvalidRequest) as caught:
        check_counts({"input": "x", "tools": [1, 2]}, limits)
    assert (caught.value.code, caught.value.param) == ("too_many_tools", "tools")


def test_values_are_counted_at_every_depth_and_the_fullest_field_is_named() -> None:
    body = {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}] * 10}],
            "metadata": {"a": "1", "b": "2"}}
    # 3 + 1 + 2 + 10 * 3 + 2 values: the top level's members, the item and its members,
    # the parts and theirs, metadata's
    raw = json.dumps(body).encode()
    assert decode_json(raw, RequestLimits(max_json_values=38)) == body
    with pytest.raises(InvalidRequest) as caught:
        decode_json(raw, RequestLimits(max_json_values=37))
    assert (caught.value.code, caught.value.param) == ("too_many_json_values", "input")
    assert "37" in caught.value.message and "ORS_MAX_JSON_VALUES" in caught.value.message
    with pytest.raises(InvalidRequest) as caught:
        decode_json(json.dumps([1] * 11), RequestLimits(max_json_values=10), what="frame")
    assert (caught.value.code, caught.value.param) == ("too_many_json_values", None)
