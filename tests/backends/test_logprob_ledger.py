"""Attributing generated tokens to the text the output parser emits (``LogprobLedger``),
driven through the real ``ToolCallParser`` the way the embedded backend drives it."""

from __future__ import annotations

import codecs
import json

from app.backends.base import Delta, TextDelta, TokenLogprob, ToolCallDelta, ToolPolicy
from app.backends.logprob_ledger import LogprobLedger
from app.backends.toolcalls import ToolCallParser


def _token(piece: bytes, text: str, index: int) -> TokenLogprob:
    return TokenLogprob(text, -0.1 * (index + 1), piece)


def run(pieces: list[bytes], parser: ToolCallParser) -> list[Delta]:
    """Generate ``pieces`` (one per token) through a UTF-8 decoder, the parser and the
    ledger, as ``LocalBackend.stream`` does."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    ledger = LogprobLedger()
    out: list[Delta] = []
    for index, piece in enumerate(pieces):
        text = decoder.decode(piece)
        ledger.add(text, _token(piece, text, index))
        out += ledger.attribute(parser.feed(text) if text else [])
    out += ledger.attribute(parser.close())
    return out


def passthrough() -> ToolCallParser:
    return ToolCallParser([], ToolPolicy())


def with_tools(*names: str, policy: ToolPolicy | None = None) -> ToolCallParser:
    return ToolCallParser(list(names), policy or ToolPolicy())


def texts(deltas: list[Delta]) -> list[TextDelta]:
    return [delta for delta in deltas if isinstance(delta, TextDelta)]


def test_passthrough_is_exact_per_delta() -> None:
    pieces = [b"Hello", b",", b" world", b"!"]
    deltas = texts(run(pieces, passthrough()))
    assert [d.text for d in deltas] == ["Hello", ",", " world", "!"]
    for delta in deltas:
        assert "".join(t.token for t in delta.logprobs) == delta.text
    assert [t.logprob for d in deltas for t in d.logprobs] == [-0.1, -0.2, -0.30000000000000004, -0.4]


def test_a_character_split_over_two_tokens_goes_with_the_text_it_completes() -> None:
    """'é' is two bytes; the token holding the first completes no character: its logprob
    goes with the next emitted text, and the bytes of all tokens still spell the text."""
    pieces = [b"caf", b"\xc3", b"\xa9", b" ok"]
    deltas = texts(run(pieces, passthrough()))
    assert [d.text for d in deltas] == ["caf", "é", " ok"]
    split = deltas[1].logprobs
    assert [(t.token, t.token_bytes) for t in split] == [("", b"\xc3"), ("é", b"\xa9")]
    for delta in deltas:
        assert "".join(t.token for t in delta.logprobs) == delta.text
    assert b"".join(t.token_bytes for d in deltas for t in d.logprobs) == "café ok".encode()


def test_a_call_written_as_text_drops_its_tokens() -> None:
    """A kept call becomes a ToolCallDelta; the tokens of its JSON (and the whitespace
    around it) belong to no text, so the text after it gets only its own tokens."""
    call = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
    pieces = [b"Sure.", b" <tool_call>", call[:20].encode(), call[20:].encode(), b"</tool_call>", b"\n", b"Done", b"."]
    deltas = run(pieces, with_tools("get_weather"))
    assert [type(d).__name__ for d in deltas] == ["TextDelta", "ToolCallDelta", "TextDelta", "TextDelta"]
    assert [(d.text, [t.token for t in d.logprobs]) for d in texts(deltas)] == [
        ("Sure.", ["Sure."]),
        ("Done", ["Done"]),
        (".", ["."]),
    ]


def test_a_dropped_call_keeps_the_text_around_it_attributed() -> None:
    """A call the policy does not allow is dropped without a trace; the prose after it
    still gets exactly its own tokens, even where the call's JSON holds the same text."""
    call = json.dumps({"name": "secret", "arguments": {"word": "The"}})
    pieces = [call[:10].encode(), call[10:].encode(), b"\n\n", b"The", b" answer", b" is", b" 42", b"."]
    parser = with_tools("secret", "other", policy=ToolPolicy(allowed=("other",)))
    deltas = run(pieces, parser)
    assert not any(isinstance(d, ToolCallDelta) for d in deltas)
    [answer] = [TextDelta("".join(d.text for d in texts(deltas)),
                          tuple(t for d in texts(deltas) for t in d.logprobs))]
    assert answer.text == "The answer is 42."
    assert "".join(t.token for t in answer.logprobs) == answer.text
    assert len(answer.logprobs) == 5


def test_held_back_whitespace_is_attributed_once() -> None:
    """The parser holds trailing whitespace back (it may precede a call): a token that
    runs past an emitted text is counted once, where it starts."""
    pieces = [b"Hi ", b"there", b" friend"]
    deltas = texts(run(pieces, with_tools("get_weather")))
    assert "".join(d.text for d in deltas) == "Hi there friend"
    assert [t.token for d in deltas for t in d.logprobs] == ["Hi ", "there", " friend"]


def test_non_text_deltas_pass_through() -> None:
    ledger = LogprobLedger()
    call = ToolCallDelta(0, name="f", arguments="{}")
    assert ledger.attribute([call]) == [call]
    assert ledger.attribute([TextDelta("unknown")]) == [TextDelta("unknown")]
