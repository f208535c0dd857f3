"""Each past message's JSON made once, for the upstream adapters' request bodies.

A conversation's past messages are the same :class:`~app.backends.base.ChatMessage`
objects turn after turn (the engine keeps each chain's conversation, see
:mod:`app.engine.context`), so an adapter that keeps each message's JSON serializes only
a turn's new messages: turn 1,000 of a chain does not serialize the 999 before it again.

Kept by object identity: an entry holds its message, so the id stays that message's own
while the entry lives. Up to :data:`LIMIT` entries per adapter, then the cache starts
over (the next turn of each chain fills it again).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from app.backends.base import ChatMessage

LIMIT = 65_536
"""Messages whose JSON one adapter keeps (a few hundred bytes each, typically)."""


def dumps(value: Any) -> str:
    """Compact JSON, non-ASCII kept as it is: what every upstream body is made of."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class MessageJson:
    """``convert`` turns one message into its JSON fragment: one JSON value, or several
    joined by commas (a message may become several items), or nothing."""

    def __init__(self, convert: Callable[[ChatMessage], str], limit: int = LIMIT) -> None:
        self._convert = convert
        self._limit = limit
        self._entries: dict[int, tuple[ChatMessage, str]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def body(self, payload: dict[str, Any], key: str, messages: Sequence[ChatMessage]) -> bytes:
        """``payload`` (a non-empty JSON object) with ``key`` set to the array of the
        messages' fragments, as UTF-8 bytes."""
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
        head = dumps(payload)
        return f'{head[:-1]},"{key}":[{",".join(fragments)}]}}'.encode()
