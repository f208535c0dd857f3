"""A WebSocket connection's memory of its responses: what ``store: false`` chains on.

:class:`ConnectionHistory` keeps, for each stream of the connection (``stream_id``;
frames without one are a stream too), the latest response that ended there, with its
whole history, so that a ``store: false`` response can be continued on the same socket.
A ``previous_response_id`` is looked up among the latest responses of every stream, so a
response of one stream can be continued on another (a fork); other ids are loaded from
the store. At most ``keep`` streams are remembered, the most recently used (a response
ended there, or a continuation found its latest response).

Eviction, as the spec asks: a continuation that fails evicts the id it referenced, from
whichever stream holds it; an evicted id is never found again on this connection, not
even in the store (``previous_response_not_found``).
"""

from __future__ import annotations

from collections import OrderedDict

from app.engine.history import History, HistorySource, merge_tools, not_found
from app.engine.items import from_stored
from app.engine.run import Run


class ConnectionHistory(HistorySource):
    """The latest response of each recent stream from memory, other ids from
    ``fallback``; evicted ids are never found again on this connection."""

    def __init__(self, fallback: HistorySource, keep: int = 1) -> None:
        self.fallback = fallback
        self.keep = max(1, keep)
        self.latest: OrderedDict[str | None, tuple[str, History]] = OrderedDict()
        """Stream → its latest response's id and history, least recently used first."""
        self.evicted: set[str] = set()

    async def load(self, response_id: str) -> History:
        if response_id in self.evicted:
            raise not_found(response_id)
        for stream, (latest_id, history) in self.latest.items():
            if latest_id == response_id:
                self.latest.move_to_end(stream)
                return history
        return await self.fallback.load(response_id)

    def stream_of(self, response_id: str) -> str | None:
        """The stream whose latest response ``response_id`` is, if one is."""
        return next((stream for stream, (latest_id, _) in self.latest.items() if latest_id == response_id), None)

    def remember(self, stream: str | None, run: Run, past: History) -> None:
        """``run`` ended on ``stream``: it is that stream's latest response."""
        output = [item.model_dump(mode="json") for item in run.response.output]
        own = [*run.input_items, *output]
        self.latest[stream] = (
            run.id,
            History(items=[*past.items, *(from_stored(item) for item in own)],
                    tools=merge_tools(past.tools, run.tools),
                    stored_items=[*past.stored_items, *own]),
        )
        self.latest.move_to_end(stream)
        while len(self.latest) > self.keep:
            self.latest.popitem(last=False)

    def evict(self, response_id: str) -> None:
        self.evicted.add(response_id)
        for stream, (latest_id, _) in list(self.latest.items()):
            if latest_id == response_id:
                del self.latest[stream]


class Fixed(HistorySource):
    """A history already loaded (the connection resolved it, so it can evict on failure)."""

    def __init__(self, history: History) -> None:
        self.history = history

    async def load(self, response_id: str) -> History:
        return self.history
