"""The Chat Completions stream decoder on its own: how a finish is told, and how an
event stream is cut into events, whatever its line breaks and however it arrives."""

from __future__ import annotations

import json
import random
import re

from app.backends.base import Finish, ReasoningDelta, TextDelta, Usage
from app.backends.chat_stream import ChunkDecoder
from app.backends.sse_parser import SSEParser


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


def _reference_events(text: str) -> list[tuple[str, str]]:
    """The SSE grammar read whole, line by line (CRLF, CR or LF), with the parser's two
    departures: an ``error:`` line dispatches at once, pending data is dispatched at the end."""
    events, event, data = [], "", []
    for line in re.split(r"\r\n|\r|\n", text):
        if not line:
            if data:
                events.append((event or "message", "\n".join(data)))
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "error":
            events.append(("error", value))
    if data:
        events.append((event or "message", "\n".join(data)))
    return events


def test_an_event_stream_is_cut_as_the_grammar_says_whatever_its_line_breaks_and_pieces() -> None:
    rng = random.Random(5)
    lines = ['data: {"a": "b c"}', "data:{}", "data:  two spaces", "data", "data: ", "event: error", "event:",
             ": ping", ":", "error: boom", "id: 7", "retry: 10", "", "", "data: \u2028 \u0085 é"]
    for _ in range(2000):
        breaks = rng.choice([["\n"], ["\r\n"], ["\r"], ["\n", "\r\n", "\r"]])
        text = "".join(rng.choice(lines) + rng.choice(breaks) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.2:
            text += rng.choice(lines)  # a last line without its break
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 4))))
        parser, events = SSEParser(), []
        for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
            events += parser.feed(text[start:end])
        events += parser.feed("", final=True)
        assert events == _reference_events(text), repr(text)


def test_whole_events_in_one_piece_are_cut_as_the_grammar_says() -> None:
    """What nearly every upstream sends (whole events, LF only, nothing pending before
    them) is read a block at a time: the same events as the lines give, whatever the
    blocks hold."""
    rng = random.Random(9)
    lines = ['data: {"a": "b c"}', "data:{}", "data:  two spaces", "data", "data: ", "event: error", "event:",
             ": ping", "error: boom", "id: 7", "", "data: \u2028 \u0085 é", 'data: {"x":"\\n"}']
    for _ in range(2000):
        blocks = ["\n".join(rng.choice(lines) for _ in range(rng.choice([1, 1, 1, 2, 3])))
                  for _ in range(rng.randint(1, 6))]
        pieces = [block + "\n\n" for block in blocks]
        step = rng.randint(1, 3)  # one or more whole events a piece
        parser, events = SSEParser(), []
        for start in range(0, len(pieces), step):
            events += parser.feed("".join(pieces[start:start + step]))
        events += parser.feed("", final=True)
        assert events == _reference_events("".join(pieces)), repr(pieces)
        whole = SSEParser()
        assert whole.feed("".join(pieces)) + whole.feed("", final=True) == _reference_events("".join(pieces))


def test_a_chunk_of_text_alone_reads_as_any_chunk() -> None:
    """A chunk whose delta holds text and nothing else is read without the general
    walk; over random deltas of every shape, the deltas are what the rules say: the
    reasoning (either field, once), then the text, then a refusal."""
    rng = random.Random(3)
    values = [None, "", "tok", "«é»", [{"type": "text", "text": "part"}], 7]
    for _ in range(3000):
        delta = {key: rng.choice(values) for key in ("content", "role", "reasoning_content", "reasoning", "refusal")
                 if rng.random() < 0.5}
        if rng.random() < 0.5:
            delta["content"] = rng.choice(["a", "tok ", "\u2028"])
        chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        expected = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            expected.append(ReasoningDelta(reasoning))
        for key in ("content", "refusal"):
            value = delta.get(key)
            text = value if isinstance(value, str) else "part" if isinstance(value, list) else ""
            if text:
                expected.append(TextDelta(text))
        assert ChunkDecoder().feed(chunk) == expected, delta
