"""Each past message's JSON made once, for the upstream adapters' request bodies.

A conversation's past messages are the same :class:`~app.backends.base.ChatMessage`
objects turn after turn (the engine keeps each chain's conversation, see
:mod:`app.engine.context`), so an adapter that keeps each message's JSON serializes only
a turn's new messages: turn 1,000 of a chain does not serialize the 999 before it again.

Kept by object identity: an entry holds its message, so the id stays that message's own
while the entry lives. Up to :data:`LIMIT` entries per adapter, then the cache starts
over (the next turn of each chain fills it again).

A long conversation's past is also kept whole: the joined JSON of the messages of each
recent body, by its first message (the conversation's, or the one after the
instructions' system message, which is new every turn). The next turn of that
conversation, whose messages begin with the same objects (one tuple comparison, by
identity), takes that text as it is and looks up only what follows, so a turn's cost
does not grow with the length of its chain. Up to :data:`RUNS_CHARS` characters of such text are
kept, the least recently used dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from app import jsontext
from app.backends.base import ChatMessage

LIMIT = 65_536
"""Messages whose JSON one adapter keeps (a few hundred bytes each, typically)."""

RUNS_CHARS = 16_000_000
"""Characters of joined past messages one adapter keeps (see the module's docstring)."""

RUN_MIN = 64
"""Conversations shorter than this many messages are not kept whole: looking their
messages up one by one costs next to nothing."""

_STARTS = (0, 1)
"""Where a conversation's past may begin in a body's messages: first, or after the
instructions' system message."""


def dumps(value: Any) -> str:
    """Compact JSON, non-ASCII kept as it is (:func:`app.jsontext.dumps`): what every
    upstream body is made of."""
    return jsontext.dumps(value)


class MessageJson:
    """``convert`` turns one message into its JSON fragment: one JSON value, or several
    joined by commas (a message may become several items), or nothing."""

    def __init__(self, convert: Callable[[ChatMessage], str], limit: int = LIMIT) -> None:
        self._convert = convert
        self._limit = limit
        self._entries: dict[int, tuple[ChatMessage, str]] = {}
        self._runs: OrderedDict[int, list[tuple[tuple[ChatMessage, ...], str]]] = OrderedDict()
        self._chars_of: dict[int, int] = {}
        self._runs_chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def body(self, payload: dict[str, Any], key: str, messages: Sequence[ChatMessage]) -> bytes:
        """``payload`` (a non-empty JSON object) with ``key`` set to the array of the
        messages' fragments, as UTF-8 bytes."""
        messages = tuple(messages)
        start, known, joined = self._known_run(messages)
        if not known and len(messages) > 1 and messages[0].role == "system":
            start = 1  # the instructions, new every turn: the conversation begins after them
        tail = self._fragments(messages[start + known:])
        run = ",".join([joined, *tail]) if joined else ",".join(tail)
        fragments = self._fragments(messages[:start])
        if run:
            fragments.append(run)
        if len(messages) - start >= RUN_MIN:
            self._keep_run(messages[start:], run)
        head = dumps(payload)
        return f'{head[:-1]},"{key}":[{",".join(fragments)}]}}'.encode()

    def _fragments(self, messages: Sequence[ChatMessage]) -> list[str]:
        """The non-empty fragments of ``messages``, each made once and kept."""
        entries = self._entries
        fragments = []
        for message in messages:
            entry = entries.get(id(message))
            if entry is None or entry[0] is not message:
                if len(entries) >= self._limit:
                    entries.clear()
                entry = entries[id(message)] = (message, self._convert(message))
            if entry[1]:
                fragments.append(entry[1])
        return fragments

    def _known_run(self, messages: tuple[ChatMessage, ...]) -> tuple[int, int, str]:
        """Where the longest kept run of past messages begins in ``messages``, how many
        messages it covers, and their joined fragments; ``(0, 0, "")`` if none fits."""
        best = (0, 0, "")
        for start in _STARTS:
            if start >= len(messages):
                break
            for run, joined in self._runs.get(id(messages[start]), ()):
                if len(run) > best[1] and messages[start:start + len(run)] == run and run[0] is messages[start]:
                    best = (start, len(run), joined)
        if best[1]:
            self._runs.move_to_end(id(messages[best[0]]))
        return best

    def _keep_run(self, run: tuple[ChatMessage, ...], joined: str) -> None:
        """Keep ``run`` (messages from a conversation's start) with its joined fragments:
        the two longest runs per first message (a conversation continued from its latest
        turn, and from an earlier one), within :data:`RUNS_CHARS` in all."""
        key = id(run[0])
        kept = [entry for entry in self._runs.pop(key, ()) if entry[0][0] is run[0] and len(entry[0]) != len(run)]
        kept = sorted([*kept, (run, joined)], key=lambda entry: len(entry[0]), reverse=True)[:2]
        self._runs_chars += sum(len(entry[1]) for entry in kept) - self._chars_of.pop(key, 0)
        self._runs[key] = kept
        self._chars_of[key] = sum(len(entry[1]) for entry in kept)
        while self._runs_chars > RUNS_CHARS and len(self._runs) > 1:
            old, _ = self._runs.popitem(last=False)
            self._runs_chars -= self._chars_of.pop(old, 0)
