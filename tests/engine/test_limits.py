"""app.engine.limits and the depth check of decode_json."""

from __future__ import annotations

import json

import pytest

from app.engine.limits import RequestLimits, check_counts, json_depth_exceeded
from app.engine.validation import decode_json
from app.errors import InvalidRequest


def test_depth_counts_objects_and_arrays() -> None:
    assert not json_depth_exceeded({"a": [{"b": 1}]}, 3)
    assert json_depth_exceeded({"a": [{"b": [1]}]}, 3)
    assert not json_depth_exceeded("x" * 1000, 1)


def test_decode_json_refuses_deep_bodies_with_the_field() -> None:
    raw = json.dumps({"model": "m", "input": [[[[["x"]]]]]}).encode()
    assert decode_json(raw, 10)["model"] == "m"
    with pytest.raises(InvalidRequest) as caught:
        decode_json(raw, 4)
    assert (caught.value.code, caught.value.param) == ("json_too_deep", "input")


def test_decode_json_beyond_the_interpreter_stack_is_a_400() -> None:
    raw = b'{"input": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with pytest.raises(InvalidRequest) as caught:
        decode_json(raw, 128)
    assert (caught.value.code, caught.value.param) == ("json_too_deep", "input")


def test_a_bracket_inside_a_string_is_not_nesting() -> None:
    raw = json.dumps({"text": "[[[[[[[[", "input": [[["x"]]]}).encode()
    with pytest.raises(InvalidRequest) as caught:
        decode_json(raw, 3)
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
