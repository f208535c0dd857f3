"""The slots of one embedded model: who generates now, who waits, and who is refused.

A model's llama-server runs ``size`` sequences at once (its slots). :class:`SlotPool`
counts them out, so that llama-server never queues work out of sight (which of its slots
a request runs in, and which cached prefix it reuses, is llama-server's own choice):

* a request takes a free place at once;
* when all are busy it waits, first come first served, and a released slot goes straight
  to the longest waiter;
* at most ``queue`` requests wait; one more is refused with ``429 too_many_requests``
  before its response starts (:meth:`SlotPool.check`) or, if the queue filled in between,
  when it asks (:meth:`SlotPool.acquire`);
* a waiter that is cancelled (its client went away) leaves the queue; a slot handed to a
  waiter that was cancelled meanwhile is passed on, never lost.
"""

from __future__ import annotations

import asyncio
from collections import deque

from app.errors import TooManyRequests


class SlotPool:
    def __init__(self, size: int, queue: int) -> None:
        if size < 1:
            raise ValueError("a model needs at least one slot")
        self.size = size
        self.queue = max(0, queue)
        self._free = set(range(size))
        self._waiters: deque[asyncio.Future[int]] = deque()

    @property
    def busy(self) -> int:
        return self.size - len(self._free)

    @property
    def waiting(self) -> int:
        return sum(1 for waiter in self._waiters if not waiter.done())

    def check(self) -> None:
        """Refuse now (429) if a request arriving now could not even wait."""
        if not self._free and self.waiting >= self.queue:
            raise self._full()

    def try_acquire(self) -> int | None:
        """A free place at once, or ``None`` (nobody waits for it: for work that may be
        skipped, such as a warm-up, which must never queue ahead of a request)."""
        if not self._free or self.waiting:
            return None
        slot = min(self._free)
        self._free.discard(slot)
        return slot

    async def acquire(self) -> int:
        """A place for the caller: a free one, or the next one released. Raises
        ``TooManyRequests`` when the queue is full."""
        if self._free:
            slot = min(self._free)
            self._free.discard(slot)
            return slot
        if self.waiting >= self.queue:
            raise self._full()
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result())  # handed over just as we were cancelled
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def release(self, slot: int) -> None:
        """Give ``slot`` back: to the longest waiter, else to the free set."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._free.add(slot)

    def _full(self) -> TooManyRequests:
        return TooManyRequests(
            f"The model is busy: all {self.size} generation slots are in use and {self.queue} requests "
            "are already waiting. Retry shortly.",
            code="too_many_requests",
        )
