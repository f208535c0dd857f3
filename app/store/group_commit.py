"""Group commit: concurrent writes share one transaction, so they share its commit.

A write is a function of an open connection (``work(connection) -> result``, see
:mod:`app.store.database`). Callers
hand it to :meth:`GroupCommit.run` and wait for *their* result, which is delivered only
after the transaction that ran it has committed: a write acknowledged to a caller is
durable (``synchronous=FULL`` on SQLite, a committed transaction on PostgreSQL).

Contract:

* ``writers`` tasks each take every write waiting (up to ``max_batch``) and run them, in
  arrival order, in one transaction. Under load a batch grows by itself: writes that
  arrive while a commit is in flight form the next batch. Alone, a write waits for
  nothing (its batch is itself); on PostgreSQL a write of one statement (``single``)
  then runs without ``BEGIN`` and ``COMMIT``, as its own transaction: one round trip.
* A write that raises fails its caller and no one else: the batch's transaction is
  rolled back and each of its writes runs again in a transaction of its own, where the
  failing one fails alone. This path is rare (a conflict, a chain deleted in between).
* Waiting costs no connection: queued writes hold nothing from the pool, so a thousand
  responses beginning at once never time out on the pool; the writers use ``writers``
  connections at most.
* A caller that is cancelled does not cancel its write: it commits (or fails) anyway,
  as a write whose caller went away still records what happened.
* :meth:`close` lets every queued write finish, then stops the writers.
* A write made with ``flush=False`` is acknowledged once committed: visible to every
  reader and safe from a crash of this process, but not yet forced to disk; a batch is
  flushed if any of its writes is. Both databases write their log in order, so the next
  flushed commit makes it durable too. This is for a response's *start* (its row before
  ``response.created``): an fsync there cost 0.13-0.2 ms at the median (up to 0.7 ms at
  p90) on a 2-core VM's disk, against about 0.01 ms without, on the path of every
  stored stream's first event. The end of a response, a cancel and a delete are always
  flushed: a response is durable before its terminal event is sent. What an OS crash
  or power loss between the two can lose is a start whose end was not yet written: the
  response is then unknown instead of recovered as ``failed``.

Two writers keep that contract. :class:`GroupCommit` runs ``writers`` asyncio tasks over
a database whose driver is asynchronous (PostgreSQL: several writers, each on its own
connection). SQLite, which has one writer and a synchronous driver, writes in a process
of its own (:class:`app.store.sqlite_writer.WriterProcess`): it takes the writes waiting
and commits them, and answers their callers with one message per batch.

SQLite's commits never checkpoint (``wal_autocheckpoint=0``, :mod:`app.store.engines`).
SQLite's own checkpoint ran inside the commit that passed 1,000 pages of WAL (about every
75th stored response) and held that commit's callers and every one queued behind it: a
stored JSON answer's p99 at concurrency 1 was 2.6 times its median. The writer
checkpoints instead once its callers are answered, after :data:`CHECKPOINT_EVERY`
transactions, when no write is waiting (or, under load that never pauses, after four
times as many regardless). It does so on its own connection, between transactions, so
the checkpoint copies the whole WAL and the next transaction starts it over: a
checkpoint on another connection, racing the writer, never caught up with it and the WAL
grew without end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sqlalchemy.engine import Connection

from app.store.database import PostgresDatabase

CHECKPOINT_EVERY = 64
"""Transactions between two checkpoints (a stored response writes about 13 pages: some
800 pages of WAL, as SQLite's own default of 1,000)."""

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
    """Whether writes run beside the event loop (SQLite's writer, a process of its own)
    rather than on it (PostgreSQL's, in ``run_sync``'s greenlet)."""

    async def run(self, work: Callable[[Connection], T], *, flush: bool = True, single: bool = False) -> T:
        """Run ``work`` in a write transaction; its result once that has committed.
        ``flush=False``: the commit need not be on disk yet, only visible and safe from
        a crash of this process (see the module's contract). ``single``: on PostgreSQL
        ``work`` is one statement (:mod:`app.store.one_statement`), which in a batch of
        its own runs as its own transaction, without ``BEGIN`` and ``COMMIT``; SQLite's
        writer, where a statement is no round trip, ignores it."""

    async def close(self) -> None:
        """Let every queued write finish, then stop."""


class GroupCommit:
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
