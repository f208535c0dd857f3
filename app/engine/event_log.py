"""The events a run has handed out, kept for those who read them later.

An :class:`EventLog` holds each event as it was sent (:class:`Emitted`: its type and
its JSON, made once by :func:`~app.protocol.events.serialize_event`). A stored run keeps
them: followers (a background response streamed, ``GET …?stream=true`` while it runs,
another replica relaying it) read them, and the store writes them with the end. A run
that is not stored keeps none (nobody can look it up), only their number.

A follower is never handed a terminal event before the log is closed: the run closes
it once its end is recorded, so a terminal event that could not be recorded (and is
taken back, :meth:`EventLog.take_back`) is never seen. Waiters are woken by changes,
never by polling; a log nobody waits on allocates nothing per event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import NamedTuple

from app.protocol.events import TERMINAL_EVENT_TYPES


class Emitted(NamedTuple):
    """One event as it leaves the engine: its type and its JSON."""

    type: str
    data: str


class EventLog:
    """The events of one run (see the module docstring). ``keep``: whether the events
    themselves are kept, or only counted."""

    __slots__ = ("keep", "events", "count", "closed", "_changed", "_watchers")

    def __init__(self, *, keep: bool) -> None:
        self.keep = keep
        self.events: list[Emitted] = []
        self.count = 0
        """How many events were added (kept or not), less those taken back."""
        self.closed = False
        """The run's outcome is final: nothing is added any more."""
        self._changed: asyncio.Event | None = None
        self._watchers = 0

    def extend(self, batch: list[Emitted]) -> None:
        """Add the events of ``batch``, in order."""
        if not batch:
            return
        self.count += len(batch)
        if self.keep:
            self.events += batch
        if self._watchers:
            self._wake()

    def take_back(self, emitted: Emitted) -> None:
        """Remove ``emitted``, the last event added, which nobody has been handed."""
        self.count -= 1
        if self.keep and self.events and self.events[-1] is emitted:
            self.events.pop()

    def kept(self) -> list[str] | None:
        """The events' JSON, to store with the end; ``None`` when they are not kept."""
        return [emitted.data for emitted in self.events] if self.keep else None

    def close(self) -> None:
        """The run's outcome is final. Idempotent."""
        if not self.closed:
            self.closed = True
            self._wake()

    async def changed(self) -> None:
        """Until the next event or the close."""
        if self._changed is None:
            self._changed = asyncio.Event()
        changed = self._changed
        self._watchers += 1
        try:
            await changed.wait()
        finally:
            self._watchers -= 1

    def _wake(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def _followable(self) -> int:
        """How many events a follower may have: all but a terminal event while the log
        is open (its end is not recorded yet)."""
        events = self.events
        if not self.closed and events and events[-1].type in TERMINAL_EVENT_TYPES:
            return len(events) - 1
        return len(events)

    async def follow(self, starting_after: int | None = None) -> AsyncIterator[Emitted]:
        """The events after sequence number ``starting_after`` (all without one), then
        each new one, until the log is closed and every event was handed out."""
        index = 0 if starting_after is None else starting_after + 1
        while True:
            while index < self._followable():
                yield self.events[index]
                index += 1
            if self.closed and index >= len(self.events):
                return
            await self.changed()
