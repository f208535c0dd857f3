"""How the store's transactions run: a synchronous function of a connection, run whole.

Every read and write of :mod:`app.store.statements` is a plain function of a SQLAlchemy
``Connection`` (``fn(connection) -> result``), so each engine runs it the cheapest way
it can, and the statements are written once:

* **SQLite** (the stdlib driver, synchronous): the whole transaction runs in one
  thread, so a transaction of five statements costs one hop off the event loop, not
  five. Writes go to the store's one writer thread (SQLite has one writer; ``BEGIN
  IMMEDIATE``; :mod:`app.store.sqlite_writer`), reads to a small pool of reader threads
  (WAL: readers never wait for the writer). The event loop never blocks on the
  database.
* **PostgreSQL** (asyncpg): the function runs through SQLAlchemy's ``run_sync`` on an
  async connection; statements are awaited inside, the event loop stays free.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.engines import (
    FLUSH_OPTION,
    SQLITE_BUSY_TIMEOUT_MS,
    WRITE_OPTION,
    begin_sqlite,
    configure_sqlite,
    create_unflushed_engine,
    reader,
    writer,
)

T = TypeVar("T")
Transaction = Callable[[Connection], T]

SQLITE_READERS = 2


class Database(abc.ABC):
    """Reads for every engine; writes go through a group commit
    (:mod:`app.store.group_commit`), which calls :meth:`PostgresDatabase.write` or, in
    SQLite's writer thread, :meth:`SqliteDatabase.transaction`."""

    @abc.abstractmethod
    async def read(self, fn: Transaction[T], *, single: bool = False) -> T:
        """Run ``fn`` in one read transaction (one snapshot for all its statements).
        ``single``: ``fn`` runs one statement, which is a snapshot of its own; PostgreSQL
        then runs it without ``BEGIN`` and ``COMMIT`` (one round trip instead of three)."""

    async def close(self) -> None:
        """Release connections and threads (after the last write has returned)."""

    @property
    @abc.abstractmethod
    def sync_engine(self) -> Engine:
        """The synchronous engine whose events see every statement run here."""


class SqliteDatabase(Database):
    def __init__(self, url: URL) -> None:
        self._engine: Engine = create_engine(
            url.set(drivername="sqlite"),
            pool_size=SQLITE_READERS + 1,
            max_overflow=0,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        )
        event.listen(self._engine, "connect", configure_sqlite)
        event.listen(self._engine, "begin", begin_sqlite)
        self._writer_engine = self._engine.execution_options(**{WRITE_OPTION: True})
        self._writing: Connection | None = None
        """The writer's own connection, kept open between writes (no checkout from the
        pool per write); used only by the writer thread."""
        self._readers = ThreadPoolExecutor(SQLITE_READERS, thread_name_prefix="store-reader")

    @property
    def sync_engine(self) -> Engine:
        return self._engine

    def transaction(self, fn: Transaction[T], *, flush: bool = True) -> T:
        """Run ``fn`` in one write transaction (``BEGIN IMMEDIATE``), committed when this
        returns. Called only by the writer thread (:mod:`app.store.sqlite_writer`).

        ``flush``: the commit is fsynced before this returns (``synchronous=FULL``).
        Without it (``NORMAL``) the commit is in the WAL, visible and safe from a crash
        of this process, and reaches the disk with the next flushed commit (the WAL is
        written in order, so one fsync covers every frame before it) or checkpoint; only
        an OS crash or a power loss in between can lose it. The setting is changed before
        ``BEGIN`` (:func:`app.store.engines.begin_sqlite`)."""
        connection = self._writer()
        try:
            connection.execution_options(**{FLUSH_OPTION: flush})
            with connection.begin():
                return fn(connection)
        except BaseException:
            # rolled back; a connection that failed is not trusted again
            self._writing = None
            connection.close()
            raise

    def checkpoint(self) -> None:
        """Copy what the WAL holds into the database file, as far as no reader's snapshot
        needs it (``PRAGMA wal_checkpoint(PASSIVE)``: it waits for no reader), on the
        writer's connection between two transactions; the next transaction then starts
        the WAL over. Called only by the writer thread (:mod:`app.store.sqlite_writer`).

        It runs in a deferred transaction (``BEGIN``, not ``BEGIN IMMEDIATE``): SQLite
        refuses to checkpoint on a connection that holds a lock, and a deferred
        transaction takes none until it reads a table, which a checkpoint does not."""
        connection = self._writer()
        try:
            connection.execution_options(**{WRITE_OPTION: False})
            with connection.begin():
                connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").all()
        finally:
            connection.execution_options(**{WRITE_OPTION: True})

    def _writer(self) -> Connection:
        """The writer's connection, opened if need be."""
        if self._writing is None:
            self._writing = self._writer_engine.connect()
        return self._writing

    def close_writer(self) -> None:
        """Close the writer's connection (by the writer thread, as it ends)."""
        if self._writing is not None:
            self._writing.close()
            self._writing = None

    async def read(self, fn: Transaction[T], *, single: bool = False) -> T:
        # a transaction in the reader thread costs no round trip: run as it is
        return await asyncio.get_running_loop().run_in_executor(self._readers, _run, self._engine, fn)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._readers.shutdown)
        await loop.run_in_executor(None, self._engine.dispose)


class PostgresDatabase(Database):
    """Writes on two pools: ``engine``'s, whose commits wait for their WAL flush, and one
    of ``writers`` connections whose commits do not (``synchronous_commit`` off for the
    session, :func:`app.store.engines.create_unflushed_engine`). A write of one statement
    may run alone, without ``BEGIN`` and ``COMMIT``: the statement is its own transaction,
    one round trip to the server instead of three."""

    def __init__(self, engine: AsyncEngine, *, writers: int) -> None:
        self._engine = engine
        self._unflushed_engine = create_unflushed_engine(engine.url, pool_size=writers)
        self._writers = {True: writer(engine), False: writer(self._unflushed_engine)}
        self._alone = {flush: pool.execution_options(isolation_level="AUTOCOMMIT")
                       for flush, pool in self._writers.items()}
        self._reader = reader(engine)
        self._reader_alone = engine.execution_options(isolation_level="AUTOCOMMIT")

    @property
    def sync_engine(self) -> Engine:
        return self._engine.sync_engine

    async def write(self, fn: Transaction[T], *, flush: bool = True, alone: bool = False) -> T:
        """Run ``fn`` in one write transaction; committed when this returns. Without
        ``flush`` the commit does not wait for its WAL flush: visible at once, and on
        disk with the next flushed commit, which PostgreSQL's WAL also writes in order.
        ``alone``: ``fn`` runs one statement (or one that decides, then reads that only
        explain an outcome that cannot change), which is run as its own transaction, in
        one round trip."""
        if alone:
            async with self._alone[flush].connect() as connection:
                return await connection.run_sync(fn)
        async with self._writers[flush].begin() as connection:
            return await connection.run_sync(fn)

    async def read(self, fn: Transaction[T], *, single: bool = False) -> T:
        if single:
            async with self._reader_alone.connect() as connection:
                return await connection.run_sync(fn)
        async with self._reader.begin() as connection:
            return await connection.run_sync(fn)

    async def close(self) -> None:
        await self._unflushed_engine.dispose()


def _run(engine: Engine, fn: Transaction[T]) -> T:
    with engine.begin() as connection:
        return fn(connection)
