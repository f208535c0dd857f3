"""Compact JSON text: what the standard library writes, faster; a lone surrogate is
escaped instead of failing; numbers keep their value. JSON read: what the standard
library reads, or the same refusal."""

from __future__ import annotations

import json
import math
import random

import pytest

from app.jsontext import dumps, dumps_bytes, loads


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


@pytest.mark.parametrize("text", [
    '{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"h\\u00e9 \\ud83d\\ude00 \\n"},"finish_reason":null}]}',
    '{"a":"\\ud83d"}',  # a lone surrogate escape: only the standard library reads it
    '{"a":"\\udc00 and more"}',
    '{"a":123456789012345678901234567890,"b":-0.0,"c":5e-324,"d":1E+2,"e":NaN,"f":-Infinity}',
    '{"a":1,"a":2}',
    ' {"nested":[{"x":[1,[2,[3]]]},true,false,null]}\n',
    "\ufeff{}",
])
def test_read_as_the_standard_library_reads(text: str) -> None:
    expected = json.loads(text) if not text.startswith("\ufeff") else None
    if expected is None:
        with pytest.raises(ValueError):
            json.loads(text)
        with pytest.raises(ValueError):
            loads(text)
        return
    for raw in (text, text.encode("utf-8", "surrogatepass")):
        got = loads(raw)
        assert repr(got) == repr(expected)  # NaN and -0.0 too


@pytest.mark.parametrize("text", ['{"a":1,}', "{'a':1}", '{"a":01}', '{"a":"\x01"}', '{"a":1}{', "", "nul"])
def test_what_the_standard_library_refuses_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        loads(text)
