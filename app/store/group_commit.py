"""Group commit: concurrent writes share one transaction, so they share its commit.

A write is a function of an open connection (``work(connection) -> result``, see
:mod:`app.store.database`). Callers hand it to ``run`` and wait for *their* result,
which is delivered only after the transaction that ran it has committed: a write
acknowledged to a caller is durable (``synchronous=FULL`` on SQLite, a committed
transaction on PostgreSQL).

Contract (:class:`Writes`), kept by both writers:

* a writer takes every write waiting (up to ``max_batch``) and runs them, in arrival
  order, in one transaction. Under load a batch grows by itself: writes that arrive
  while a commit is in flight form the next batch. Alone, a write waits for nothing
  (its batch is itself);
* a write that raises fails its caller and no one else: the batch's transaction is
  rolled back and each of its writes runs again in a transaction of its own, where the
  failing one fails alone. This path is rare (a conflict, a chain deleted in between);
* waiting costs no connection: queued writes hold nothing from the pool, so a thousand
  responses beginning at once never time out on the pool;
* a caller that is cancelled does not cancel its write: it commits (or fails) anyway,
  as a write whose caller went away still records what happened;
* ``close`` lets every queued write finish, then stops; a write asked for afterwards
  raises ``RuntimeError``;
* a write made with ``flush=False`` is acknowledged once committed: visible to every
  reader and safe from a crash of this process, but not yet forced to disk; a batch is
  flushed if any of its writes is. Both databases write their log in order, so the next
  flushed commit makes it durable too. This is for a response's *start* (its row before
  ``response.created``), which is on the path of every stored stream's first event. The
  end of a response, a cancel and a delete are always flushed: a response is durable
  before its terminal event is sent. What an OS crash or power loss between the two can
  lose is a start whose end was not yet written: the response is then unknown instead
  of recovered as ``failed``.

The two writers. :class:`GroupCommit` (PostgreSQL) runs ``writers`` asyncio tasks, each
committing on its own connection through the asynchronous driver; a write of one
statement (``single``) in a batch of its own runs without ``BEGIN`` and ``COMMIT``, as its
own transaction: one round trip. SQLite, which has one writer and a synchronous driver,
writes on a thread of its own (:class:`app.store.sqlite_writer.SqliteWriter`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sqlalchemy.engine import Connection

from app.store.database import PostgresDatabase

T = TypeVar("T")
Work = Callable[[Connection], Any]


@dataclass(slots=True)
class _Write:
    work: Work
    flush: bool = True
    single: bool = False
    done: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Writes(Protocol):
    """What the store writes through: either kind of group commit."""

    batches: int
    """Transactions committed (for tests and benchmarks: writes per commit)."""

    beside_loop: bool
    """Whether writes run beside the event loop (SQLite's writer thread) rather than on
    it (PostgreSQL's, in ``run_sync``'s greenlet)."""

    async def run(self, work: Callable[[Connection], T], *, flush: bool = True, single: bool = False) -> T:
        """Run ``work`` in a write transaction; its result once that has committed.
        ``flush=False``: the commit need not be on disk yet, only visible and safe from
        a crash of this process (see the module's contract). ``single``: on PostgreSQL
        ``work`` is one statement (:mod:`app.store.one_statement`), which in a batch of
        its own runs as its own transaction, without ``BEGIN`` and ``COMMIT``; SQLite's
        writer, where a statement is no round trip, ignores it. Raises ``RuntimeError``
        once :meth:`close` was called."""

    async def close(self) -> None:
        """Let every queued write finish, then stop. Idempotent."""


class GroupCommit:
    """PostgreSQL's writers: ``writers`` asyncio tasks (see the module's contract)."""

    beside_loop = False

    def __init__(self, database: PostgresDatabase, *, writers: int = 1, max_batch: int = 128) -> None:
        self._database = database
        self._max_batch = max_batch
        self._queue: asyncio.Queue[_Write | None] = asyncio.Queue()
        self._tasks = [asyncio.create_task(self._writer(), name=f"store-writer-{i}") for i in range(writers)]
        self.batches = 0
        """Transactions committed (for tests and benchmarks: writes per commit)."""

    async def run(self, work: Callable[[Connection], T], *, flush: bool = True, single: bool = False) -> T:
        if not self._tasks:
            raise RuntimeError("the store is closed")
        write = _Write(work, flush, single)
        self._queue.put_nowait(write)
        return await asyncio.shield(write.done)  # type: ignore[no-any-return]

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        for _ in tasks:
            self._queue.put_nowait(None)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _writer(self) -> None:
        while True:
            first = await self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < self._max_batch and not self._queue.empty():
                more = self._queue.get_nowait()
                if more is None:
                    stop = True
                    break
                batch.append(more)
            await self._commit(batch)
            if stop:
                return

    async def _commit(self, batch: list[_Write]) -> None:
        try:
            if len(batch) == 1:
                results = [await self._database.write(batch[0].work, flush=batch[0].flush, alone=batch[0].single)]
            else:
                results = await self._database.write(lambda connection: [write.work(connection) for write in batch],
                                                     flush=_flushed(batch))
        except Exception as error:
            if len(batch) == 1:
                _settle(batch[0].done, error=error)
                return
            for write in batch:  # one by one: only the failing write fails
                await self._commit([write])
            return
        except BaseException as error:  # cancelled while committing: the callers learn it
            for write in batch:
                _settle(write.done, error=error)
            raise
        self.batches += 1
        for write, result in zip(batch, results, strict=True):
            _settle(write.done, result=result)


def _flushed(batch: list[_Write]) -> bool:
    """A batch is flushed if any of its writes must be."""
    return any(write.flush for write in batch)


def _settle(future: asyncio.Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
        with contextlib.suppress(Exception):
            # a caller that went away never retrieves it; do not let asyncio complain
            future.exception()
