"""SQLite's one writer: a thread of the server that group-commits the store's writes.

SQLite has one writer at a time, and its driver is synchronous. So every write of the
store goes to one thread (:class:`SqliteWriter`), which keeps one connection open and
runs the writes it is handed in transactions of its own, beside the event loop: the
loop only puts a write on a queue and later takes its outcome. Reads run on reader
threads of their own (:class:`app.store.database.SqliteDatabase`) and, with WAL, never
wait for it.

The contract of :mod:`app.store.group_commit` holds:

* a batch takes every write waiting (up to ``max_batch``), in arrival order, and runs
  them in one transaction: concurrent writes share a commit;
* a write is delivered once the transaction that ran it has committed (flushed, unless
  every write of the batch was made with ``flush=False``);
* a write that raises fails alone: the batch is rolled back and each of its writes runs
  again in a transaction of its own;
* a caller that is cancelled does not cancel its write;
* :meth:`SqliteWriter.close` lets every write handed over before it commit, then stops
  the thread; a write asked for after that raises ``RuntimeError`` at once.

The outcomes of one batch reach the event loop together, in one callback.

Checkpoints. SQLite's commits never checkpoint (``wal_autocheckpoint=0``, see
:mod:`app.store.engines`): its own checkpoint would run inside whichever commit passed
the threshold and hold that commit's callers and everyone queued behind them. The writer
checkpoints instead, on its own connection and between two transactions, once its
callers are answered: after :data:`CHECKPOINT_EVERY` transactions when no write is
waiting, or after four times as many when writes never stop coming. Between two
transactions the checkpoint can copy the whole WAL, so the next transaction starts it
over and the WAL stays short.

If the thread ever ends unexpectedly (a bug), the writes waiting for it fail with
:class:`WriterStopped` and so does every later write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

from app.errors import ServerError
from app.store.database import SqliteDatabase

log = logging.getLogger("ors.store")

T = TypeVar("T")
Work = Callable[[Connection], Any]
Outcome = tuple[Any, BaseException | None]

MAX_BATCH = 128
CHECKPOINT_EVERY = 64
"""Transactions between two checkpoints (in pages of WAL, about SQLite's own default)."""


class WriterStopped(ServerError):
    """The writer thread ended while a write waited for it, or before it was asked."""


@dataclass(slots=True)
class _Write:
    work: Work
    flush: bool
    done: asyncio.Future[Any]


class SqliteWriter:
    """The store's writes on SQLite, run by one thread (see the module's contract)."""

    beside_loop = True

    def __init__(self, database: SqliteDatabase, *, max_batch: int = MAX_BATCH) -> None:
        self._database = database
        self._max_batch = max_batch
        self._loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()
        self._stopped: asyncio.Future[None] = self._loop.create_future()
        self._open = True
        self._ended = False
        """Set by the thread as it ends; read and set under ``_ending``."""
        self._ending = threading.Lock()
        self.batches = 0
        """Transactions committed (for tests and benchmarks: writes per commit)."""
        self.checkpoints = 0
        """Checkpoints run (for tests)."""
        self._checkpointed_at = 0
        self._thread = threading.Thread(target=self._serve, name="store-writer", daemon=True)
        self._thread.start()

    async def run(self, work: Callable[[Connection], T], *, flush: bool = True, single: bool = False) -> T:
        """``single`` is for PostgreSQL (:class:`app.store.group_commit.Writes`); here a
        statement costs no round trip, so it changes nothing."""
        if not self._open:
            raise RuntimeError("the store is closed")
        write = _Write(work, flush, self._loop.create_future())
        with self._ending:
            if self._ended:
                raise WriterStopped("The store's writer has stopped; see the log above.")
            self._queue.put(write)
        return await asyncio.shield(write.done)  # type: ignore[no-any-return]

    async def close(self) -> None:
        """Let every write handed over commit, then stop the thread and close its
        connection."""
        if not self._open:
            return
        self._open = False
        self._queue.put(None)
        await asyncio.shield(self._stopped)

    # -- the writer thread ----------------------------------------------------------

    def _serve(self) -> None:
        batch: list[_Write] = []
        try:
            stop = False
            while not stop:
                first = self._queue.get()
                if first is None:
                    break
                batch = [first]
                while len(batch) < self._max_batch:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        stop = True
                        break
                    batch.append(more)
                self._wake(_deliver, batch, self._commit(batch))
                batch = []
                self._maybe_checkpoint()
        except BaseException:  # noqa: BLE001 - a bug: logged, and every write from now on fails
            log.exception("The store's writer stopped unexpectedly.")
        finally:
            with self._ending:
                self._ended = True
            self._fail_waiting(batch)
            try:
                self._database.close_writer()
            finally:
                self._wake(_settle, self._stopped, None, None)

    def _commit(self, batch: list[_Write]) -> list[Outcome]:
        """Each write's ``(result, None)`` or ``(None, error)``, in order."""
        try:
            results = self._database.transaction(lambda connection: [write.work(connection) for write in batch],
                                                 flush=any(write.flush for write in batch))
        except Exception as error:
            if len(batch) == 1:
                return [(None, error)]
            # one by one: only the failing write fails
            return [outcome for write in batch for outcome in self._commit([write])]
        self.batches += 1
        return [(result, None) for result in results]

    def _maybe_checkpoint(self) -> None:
        since = self.batches - self._checkpointed_at
        if since < CHECKPOINT_EVERY or (since < 4 * CHECKPOINT_EVERY and not self._queue.empty()):
            return
        self._checkpointed_at = self.batches
        try:
            self._database.checkpoint()
            self.checkpoints += 1
        except Exception:  # noqa: BLE001 - the next one will try again; commits go on
            log.exception("A checkpoint of the store failed.")

    def _fail_waiting(self, batch: list[_Write]) -> None:
        """Fail the writes of ``batch`` (whose outcome is unknown) and those still queued
        (none of either unless the thread ended unexpectedly)."""
        waiting = list(batch)
        with contextlib.suppress(queue.Empty):
            while True:
                write = self._queue.get_nowait()
                if write is not None:
                    waiting.append(write)
        if waiting:
            stopped = WriterStopped("The store's writer stopped before it answered this write.")
            self._wake(_deliver, waiting, [(None, stopped)] * len(waiting))

    def _wake(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            log.warning("The store's writer finished after its event loop closed.")


def _deliver(batch: list[_Write], outcomes: list[Outcome]) -> None:
    for write, (result, error) in zip(batch, outcomes, strict=True):
        _settle(write.done, result, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
        future.exception()  # a caller that went away never retrieves it; asyncio need not complain
