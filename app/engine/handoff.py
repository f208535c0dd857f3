"""The bounded hand-over between a turn's pump and the one consumer of its deltas.

:class:`Handoff` is ``asyncio.Queue`` cut to what a turn uses (:mod:`app.engine.turn`):
``put``, ``put_nowait``, ``get``, ``get_nowait``, ``empty``, ``full``, for one task
that waits to put (the pump) and one that waits to get (the consumer). Others may only
``put_nowait`` (the control path's wake marker). What is left out is what a turn never
asked for: ``task_done``/``join`` (asyncio's queue clears an event on every put to
serve them) and lists of waiters (asyncio's queue wakes through them on every put and
get). A stream's deltas crossed asyncio's queue in about 70 Python calls; here each put
and get is one call, and a wait is one future.

The contract, as asyncio's for one producer and one consumer: items come out in the
order they went in; ``put_nowait`` on a full hand-over raises ``asyncio.QueueFull``
and ``get_nowait`` on an empty one ``asyncio.QueueEmpty``; ``put`` waits while it is
full, ``get`` while it is empty, and each is woken by the other side's next step. A
cancelled wait leaves nothing behind: its future is dropped, and the item (or the
room) it waited for stays for the next call.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Generic, TypeVar

T = TypeVar("T")


class Handoff(Generic[T]):
    __slots__ = ("_items", "_size", "_getter", "_putter")

    def __init__(self, maxsize: int) -> None:
        self._items: collections.deque[T] = collections.deque()
        self._size = maxsize
        self._getter: asyncio.Future[None] | None = None
        """The consumer's wait for an item, while it waits."""
        self._putter: asyncio.Future[None] | None = None
        """The producer's wait for room, while it waits."""

    def empty(self) -> bool:
        return not self._items

    def full(self) -> bool:
        return len(self._items) >= self._size

    def qsize(self) -> int:
        return len(self._items)

    def put_nowait(self, item: T) -> None:
        if len(self._items) >= self._size:
            raise asyncio.QueueFull
        self._items.append(item)
        getter = self._getter
        if getter is not None:
            self._getter = None
            if not getter.done():
                getter.set_result(None)

    async def put(self, item: T) -> None:
        while len(self._items) >= self._size:
            putter = self._putter = asyncio.get_running_loop().create_future()
            await putter
        self.put_nowait(item)

    def get_nowait(self) -> T:
        if not self._items:
            raise asyncio.QueueEmpty
        item = self._items.popleft()
        putter = self._putter
        if putter is not None:
            self._putter = None
            if not putter.done():
                putter.set_result(None)
        return item

    async def get(self) -> T:
        while not self._items:
            getter = self._getter = asyncio.get_running_loop().create_future()
            await getter
        return self.get_nowait()
