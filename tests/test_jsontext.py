"""Compact JSON text: what the standard library writes, faster; a lone surrogate is
escaped instead of failing; numbers keep their value."""

from __future__ import annotations

import json
import math
import random

import pytest

from app.jsontext import dumps, dumps_bytes


def _stdlib(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("value", [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "héllo \u2028 😀 \"q\" \\ \n\t"}]},
    [1, -2, 10**30, 0.1, 1.5e300, -0.0, True, None, "", {}, []],
    {"nested": {"deep": [{"x": [1, [2, [3]]]}]}, "ünïcode": "ключ"},
    "plain",
])
def test_the_same_text_as_the_standard_library(value: object) -> None:
    assert dumps(value) == _stdlib(value)
    assert dumps_bytes(value) == _stdlib(value).encode()


def test_a_lone_surrogate_is_escaped_not_an_error() -> None:
    value = {"text": "cut \ud83d here, é kept"}
    text = dumps(value)
    text.encode("utf-8")  # encodable
    assert json.loads(text) == value
    assert json.loads(dumps_bytes(value)) == value


def test_floats_keep_their_value() -> None:
    rng = random.Random(7)
    values = [1e-5, 1e-7, 1e22, 5e-324, 1.7976931348623157e308, 0.1 + 0.2]
    values += [math.ldexp(rng.random(), rng.randint(-1000, 1000)) for _ in range(2000)]
    assert json.loads(dumps(values)) == values


def test_what_json_cannot_hold_is_still_a_type_error() -> None:
    with pytest.raises(TypeError):
        dumps({"x": object()})
