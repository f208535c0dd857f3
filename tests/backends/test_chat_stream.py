"""The Chat Completions stream decoder on its own: how a finish is told."""

from __future__ import annotations

import json

from app.backends.base import Finish, Usage
from app.backends.chat_stream import ChunkDecoder


def _call_chunk(arguments: str, *, name: str | None = None, reason: str | None = None) -> str:
    function = {"arguments": arguments, **({"name": name} if name else {})}
    delta = {"tool_calls": [{"index": 0, **({"id": "call_1"} if name else {}), "function": function}]}
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": reason}]})


def _decode(decoder: ChunkDecoder, *events: str) -> Finish:
    for data in events:
        decoder.feed_event("message", data)
    decoder.feed_event("message", "[DONE]")
    return decoder.finish()


def test_a_call_cut_by_the_budget_but_reported_as_tool_calls_is_a_length_stop() -> None:
    """llama-cpp-python's server says ``tool_calls`` when max_tokens cut a call short."""
    events = (_call_chunk('{"city": "Pa', name="get_weather"), _call_chunk("", reason="tool_calls"))
    assert _decode(ChunkDecoder(16), *events).reason == "length"


def test_a_complete_call_stays_tool_calls() -> None:
    events = (_call_chunk('{"city": ', name="get_weather"), _call_chunk('"Paris"}', reason="tool_calls"))
    assert _decode(ChunkDecoder(16), *events).reason == "tool_calls"


def test_without_a_budget_or_with_budget_left_a_broken_call_is_not_called_a_budget_stop() -> None:
    events = (_call_chunk('{"city": "Pa', name="get_weather"), _call_chunk("", reason="tool_calls"))
    assert _decode(ChunkDecoder(None), *events).reason == "tool_calls"
    usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}})
    finish = _decode(ChunkDecoder(16), *events, usage)
    assert finish == Finish("tool_calls", Usage(input_tokens=9, output_tokens=5))
