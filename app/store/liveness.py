"""Telling a dead owner from a live one, for recovery.

Every response row names the instance that runs it (``owner``). A row left ``queued`` or
``in_progress`` may be failed only once its owner is known to be dead; a live replica's
rows must never be touched.

* **SQLite** is single-process by design, and this is enforced: the store holds an
  exclusive ``flock`` on ``<database>.lock`` for its whole life, and a second process
  (or a second store in the same process) cannot open the same file. So at ``open()``
  every other instance is dead. The kernel drops the lock when the process dies, even
  by ``kill -9``.
* **PostgreSQL**: each store holds a session-level advisory lock keyed on its instance
  id, on one dedicated connection checked out of the pool for the store's whole life
  (session locks belong to a connection, so the lock must never go back to the pool).
  An owner is dead iff its lock can be taken: the server releases a session's locks as
  soon as its connection ends, including when the process is killed. The probe keeps
  the dead owner's lock while its rows are failed, then releases it. If the dedicated
  connection breaks, :meth:`heartbeat` reconnects and takes the lock again (the store
  calls it within about a second of finding the database out of reach, and then every
  second until it succeeds); in between, other replicas may fail this instance's
  running responses (their ``finish`` then raises :class:`~app.store.base.StoreConflict`).
  After an outage, which takes every replica's lock, a store whose heartbeat had to take
  its own lock again does not judge the others in that pass (``SqlResponseStore.check``).

An instance id must be unique per process start (e.g. a random UUID): a store refuses
to open with an id whose lock is held.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import logging
import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import anyio.to_thread
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.store.engines import unreachable
from app.store.migrate import advisory_key

log = logging.getLogger("ors.store")


class StoreInUse(RuntimeError):
    """Another live store owns what this one needs (the SQLite file, or the instance id)."""


class Liveness(abc.ABC):
    periodic: bool
    """Whether owners can die while this store runs (so recovery must be repeated)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Declare this instance alive; raises :class:`StoreInUse` if it cannot."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def heartbeat(self) -> bool:
        """Make sure this instance still shows as alive; whether it had to declare itself
        alive again (its lock had been lost)."""
        return False

    @abc.abstractmethod
    def claim_if_dead(self, owner: str) -> AbstractAsyncContextManager[bool]:
        """An async context yielding whether ``owner`` is dead; while it is open, the
        owner cannot come back to life."""


class SingleProcessLiveness(Liveness):
    """SQLite: this store is the only one alive."""

    periodic = False

    def __init__(self, database: Path) -> None:
        self.lock_path = database.with_name(database.name + ".lock")
        self._fd: int | None = None

    async def start(self) -> None:
        self._fd = await anyio.to_thread.run_sync(self._lock)

    def _lock(self) -> int:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreInUse(
                f"The store {self.lock_path.with_suffix('')} is in use by another server process."
            ) from None
        return fd

    async def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @asynccontextmanager
    async def claim_if_dead(self, owner: str) -> AsyncIterator[bool]:
        yield True


class AdvisoryLockLiveness(Liveness):
    """PostgreSQL: a session-level advisory lock per live instance."""

    periodic = True

    def __init__(self, engine: AsyncEngine, instance_id: str) -> None:
        self._engine = engine
        self._key = instance_key(instance_id)
        self._instance_id = instance_id
        self._connection: AsyncConnection | None = None

    async def start(self) -> None:
        self._connection = await self._connect_and_lock()

    async def _connect_and_lock(self) -> AsyncConnection:
        connection = await self._engine.connect()
        try:
            connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
            if not await _try_lock(connection, self._key):
                raise StoreInUse(f"Instance id {self._instance_id!r} is in use by a live server.")
        except BaseException:
            await connection.close()
            raise
        return connection

    async def heartbeat(self) -> bool:
        """Check the lock's connection; if it broke, connect and take the lock again
        (raises if the database cannot be reached: the caller tries again later)."""
        connection = self._connection
        if connection is not None:
            try:
                await connection.execute(text("SELECT 1"))
                return False
            except Exception:
                log.warning("The store's lock connection broke; taking the instance lock again.", exc_info=True)
            self._connection = None
            with contextlib.suppress(Exception):  # a broken connection: nothing to hand back
                await connection.invalidate()
                await connection.close()
        self._connection = await self._connect_and_lock()
        return True

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            await connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self._key})
        except Exception as error:
            if not unreachable(error):
                raise
            # a session's lock ends with it: nothing is left to release
            log.warning("The store's lock connection was lost before shutdown (its lock with it): %r", error)
        finally:
            await connection.invalidate()
            await connection.close()

    @asynccontextmanager
    async def claim_if_dead(self, owner: str) -> AsyncIterator[bool]:
        connection = self._connection
        if connection is None:
            raise RuntimeError("the store is not open")
        key = instance_key(owner)
        if key == self._key or not await _try_lock(connection, key):
            yield False
            return
        try:
            yield True
        finally:
            await connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})


def instance_key(instance_id: str) -> int:
    return advisory_key("ors:store:instance:" + instance_id)


async def _try_lock(connection: AsyncConnection, key: int) -> bool:
    result = await connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": key})
    return bool(result.scalar_one())
