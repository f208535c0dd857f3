"""Which generated tokens made which emitted text: logprobs for the embedded backend.

The embedded backend knows each token's logprob when it samples it, but what reaches the
client is what the output parser (``toolcalls.ToolCallParser``) makes of the text: it
holds text back, merges pieces, and drops some (a call written as text, whitespace around
it, anything left of a forced call cut short). :class:`LogprobLedger` attributes the
tokens to the parser's emitted ``TextDelta``s after parsing, without the parser's help.

The contract:

* :meth:`LogprobLedger.add` records every generated token in order, with its text as the
  UTF-8 decoder gave it (empty for a token that completes no character).
* :meth:`LogprobLedger.attribute` takes the parser's deltas and returns them with each
  non-empty ``TextDelta`` carrying the logprobs of its tokens. An emitted text is always
  a piece of the generated text, later than the ones before it; the ledger finds where it
  starts among the tokens not yet attributed. Tokens before that point belong to text the
  parser dropped and are discarded. Tokens that overlap the emitted text are its tokens;
  one that runs past its end is counted there, and the rest of its text stays in the
  ledger (without a logprob) for the next piece. An empty-text token goes with the text
  that follows it.
* Where the parser passes text through unchanged (no tools, ``tool_choice: none``), every
  emitted piece is exactly the text of its tokens, so the attribution is exact: the token
  texts of a delta's logprobs concatenate to the delta's text. Around dropped text the
  starting point is found by search, preferring a point right after whitespace or after
  the end of a call block (``}``, a fence, ``</tool_call>``); a piece of text that also
  occurs inside the dropped call may then be matched there. That is the only inexactness.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from app.backends.base import Delta, TextDelta, TokenLogprob
from app.backends.toolcalls import FENCE, TAG_CLOSE

_DROPPED_SPAN_ENDS = ("}", FENCE, TAG_CLOSE)
"""How text the parser dropped ends (whitespace aside): a call object, fence or tag."""


class LogprobLedger:
    """The tokens of one generation not yet attributed to emitted text; see the module
    docstring."""

    def __init__(self) -> None:
        self._entries: deque[tuple[str, TokenLogprob | None]] = deque()

    def add(self, text: str, logprob: TokenLogprob) -> None:
        """One generated token: its decoded text (may be empty) and its logprob."""
        self._entries.append((text, logprob))

    def attribute(self, deltas: Sequence[Delta]) -> list[Delta]:
        """``deltas`` with every non-empty ``TextDelta`` carrying its tokens' logprobs."""
        return [
            TextDelta(delta.text, self._take(delta.text)) if isinstance(delta, TextDelta) and delta.text else delta
            for delta in deltas
        ]

    def _take(self, text: str) -> tuple[TokenLogprob, ...]:
        entries = self._entries
        pending = "".join(entry for entry, _ in entries)
        start = _start_of(text, pending)
        if start is None:
            return ()
        end = start + len(text)
        taken: list[TokenLogprob] = []
        position = 0
        while entries and position < end:  # a token at ``end`` is the next piece's
            token_text, logprob = entries[0]
            token_end = position + len(token_text)
            if position < start and token_end <= start:
                entries.popleft()  # text the parser dropped
            else:
                if logprob is not None:
                    taken.append(logprob)
                if token_end > end:
                    entries[0] = (token_text[end - position :], None)
                    break
                entries.popleft()
            position = token_end
        return tuple(taken)


def _start_of(text: str, pending: str) -> int | None:
    """Where ``text`` starts in ``pending``: at once if it can, else after what the parser
    plausibly dropped, else at its first occurrence; ``None`` if it is not there."""
    if pending.startswith(text):
        return 0
    first = at = pending.find(text)
    while at >= 0:
        skipped = pending[:at].rstrip()
        if not skipped or skipped.endswith(_DROPPED_SPAN_ENDS):
            return at
        at = pending.find(text, at + 1)
    return first if first >= 0 else None
