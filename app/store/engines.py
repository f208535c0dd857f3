"""The two database engines and how transactions are begun on each.

SQLite (one server process, a file):

* ``journal_mode=WAL``: readers never block the writer nor each other;
* ``synchronous=FULL``: a commit is fsynced to the WAL before it returns, so a
  committed response survives not only ``kill -9`` of the server (which ``NORMAL``
  already survives) but also a power loss or an OS crash. A response's start alone is
  committed with ``NORMAL`` and reaches the disk with the next flushed commit (see
  :mod:`app.store.group_commit`);
* ``foreign_keys=ON``, ``busy_timeout`` so that writers queue instead of failing;
* ``wal_autocheckpoint=0``: a commit never copies the WAL into the database file itself
  (SQLite's default does so inside whichever commit passes 1,000 pages, holding its
  callers and every write queued behind them); the writer does it between transactions,
  once its callers are answered (:mod:`app.store.sqlite_writer`);
* the driver's own transaction handling is turned off and SQLAlchemy emits ``BEGIN``:
  reads run in a deferred transaction (one snapshot for all their statements), writes
  in ``BEGIN IMMEDIATE`` (the write lock is taken up front, so a transaction that reads
  before it writes cannot fail half-way with ``SQLITE_BUSY``).

PostgreSQL (several replicas, asyncpg): writes run in ``READ COMMITTED`` with explicit
row locks where they matter; reads that issue several statements run in ``REPEATABLE
READ`` so that they see one snapshot; every statement gets a custom plan (see
``POSTGRES_SETTINGS``). A pooled connection is checked before use only if it has been
idle for more than :data:`ALIVE_BYPASS_SECONDS` (:func:`ping_when_idle`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import event, exc
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

SQLITE_DRIVER = "sqlite+aiosqlite"
POSTGRES_DRIVER = "postgresql+asyncpg"
SQLITE_BUSY_TIMEOUT_MS = 30_000
SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA foreign_keys=ON",
    f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
    "PRAGMA wal_autocheckpoint=0",
)
POSTGRES_SETTINGS = {"plan_cache_mode": "force_custom_plan"}
"""asyncpg prepares every statement, and PostgreSQL would soon switch such a statement to
a generic plan chosen while the tables were small: the chain's recursive CTE then scans
the whole table at each step. A custom plan for each execution always walks the
indexes."""
WRITE_OPTION = "ors_write"
"""Execution option marking a connection whose transactions write."""
FLUSH_OPTION = "ors_flush"
"""Execution option of a SQLite write connection: whether its commits are fsynced
(``synchronous=FULL``, every connection's setting at first) or not (``NORMAL``); see
:meth:`app.store.database.SqliteDatabase.transaction`."""


def normalize_url(url: str | URL) -> URL:
    """The URL with its async driver: ``sqlite:`` becomes ``sqlite+aiosqlite:``,
    ``postgresql:`` / ``postgres:`` become ``postgresql+asyncpg:``. Other drivers and
    databases are refused."""
    parsed = make_url(url)
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite" and driver in ("", "aiosqlite"):
        parsed = parsed.set(drivername=SQLITE_DRIVER)
        database = parsed.database or ""
        if database in ("", ":memory:") or parsed.query.get("mode") == "memory":
            raise ValueError("The response store is durable: give SQLite a file, not memory.")
        return parsed
    if backend in ("postgresql", "postgres") and driver in ("", "asyncpg"):
        return parsed.set(drivername=POSTGRES_DRIVER)
    raise ValueError(
        f"Unsupported database URL {parsed.render_as_string(hide_password=True)!r}: "
        "use sqlite+aiosqlite:///path/to/ors.db or postgresql+asyncpg://user@host/db."
    )


def sqlite_url(path: Path) -> str:
    return URL.create(SQLITE_DRIVER, database=str(path)).render_as_string()


def is_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite"


def sqlite_path(url: URL) -> Path:
    assert url.database
    return Path(url.database)


def create_engine(url: URL, *, pool_size: int = 10) -> AsyncEngine:
    """One engine (one pool) per store; SQLite gets its pragmas and ``BEGIN`` handling."""
    if not is_sqlite(url):
        return _postgres_engine(url, pool_size=pool_size, max_overflow=pool_size, settings=POSTGRES_SETTINGS)
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
    )
    event.listen(engine.sync_engine, "connect", configure_sqlite)
    event.listen(engine.sync_engine, "begin", begin_sqlite)
    return engine


def create_unflushed_engine(url: URL, *, pool_size: int) -> AsyncEngine:
    """PostgreSQL connections whose commits do not wait for their WAL flush
    (``synchronous_commit`` off for the whole session), for the writes that need not be
    on disk before they are answered (a response's start, :mod:`app.store.group_commit`).
    A pool of their own: setting it per transaction (``SET LOCAL``) was a round trip of
    its own for each such write. ``pool_size`` connections at most (one per writer)."""
    return _postgres_engine(url, pool_size=pool_size, max_overflow=0,
                            settings=POSTGRES_SETTINGS | {"synchronous_commit": "off"})


def _postgres_engine(url: URL, *, pool_size: int, max_overflow: int, settings: dict[str, str]) -> AsyncEngine:
    engine = create_async_engine(url, pool_size=pool_size, max_overflow=max_overflow,
                                 connect_args={"server_settings": settings})
    ping_when_idle(engine)
    return engine


def unreachable(error: BaseException) -> bool:
    """Whether ``error`` says the database cannot be reached (down, restarting, shutting
    down, its connections lost, refused or exhausted) rather than that a statement
    failed: SQLAlchemy's ``OperationalError`` and ``InterfaceError`` (SQLite's locked or
    unreadable file, a PostgreSQL connection that broke), a pool that could not connect
    (``DisconnectionError``) or had no connection to give (``TimeoutError``), and what
    asyncpg raises itself while connecting."""
    return isinstance(error, (exc.OperationalError, exc.InterfaceError, exc.DisconnectionError, exc.TimeoutError,
                              OSError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
                              asyncpg.InterfaceError))


ALIVE_BYPASS_SECONDS = 0.5
"""A pooled connection returned less than this long ago is used without a check
(HikariCP's ``aliveBypassWindowMs``, 500 ms by default)."""
_RETURNED_AT = "ors_returned_at"


def ping_when_idle(engine: AsyncEngine, bypass_seconds: float = ALIVE_BYPASS_SECONDS) -> None:
    """Check a pooled connection before use only if it sat idle in the pool for more
    than ``bypass_seconds``; a new connection, or one returned since, is used as it is.

    SQLAlchemy's ``pool_pre_ping`` checks every checkout, and on asyncpg its check is
    three round trips (``BEGIN``, an empty query, ``ROLLBACK``), on every read and write
    of the store. A connection that failed
    the check is dropped and another taken (the pool's ``DisconnectionError``
    contract), as with ``pool_pre_ping``. What is given up: a connection that broke
    within the window (the server restarted just after it was returned) fails its
    next statement instead; that error invalidates the pool, so the connections
    after it are new."""
    sync_engine = engine.sync_engine
    dialect = sync_engine.dialect

    def returned(dbapi_connection: Any, record: Any) -> None:
        record.info[_RETURNED_AT] = time.monotonic()

    def checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        returned_at = record.info.pop(_RETURNED_AT, None)
        if returned_at is None or time.monotonic() - returned_at <= bypass_seconds:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except Exception as error:  # noqa: BLE001 - any failure: not a connection to use
            raise exc.DisconnectionError(f"a pooled connection failed its check: {error}") from error

    event.listen(sync_engine, "checkin", returned)
    event.listen(sync_engine, "checkout", checked_out)


def writer(engine: AsyncEngine) -> AsyncEngine:
    """The engine for write transactions (``BEGIN IMMEDIATE`` on SQLite)."""
    return engine.execution_options(**{WRITE_OPTION: True})


def reader(engine: AsyncEngine) -> AsyncEngine:
    """The engine for reads that must see one snapshot across their statements."""
    if engine.dialect.name == "postgresql":
        return engine.execution_options(isolation_level="REPEATABLE READ")
    return engine


def configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        for pragma in SQLITE_PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def begin_sqlite(connection: Connection) -> None:
    """SQLite's ``BEGIN`` (``BEGIN IMMEDIATE`` for a write), emitted by the store itself:
    the driver's own transaction handling is off (:func:`configure_sqlite`). A write's
    :data:`FLUSH_OPTION` sets ``synchronous`` first, here, as SQLite refuses to change it
    inside a transaction; only when the connection's setting differs."""
    options = connection.get_execution_options()
    flush = options.get(FLUSH_OPTION)
    if flush is not None and connection.info.get(FLUSH_OPTION, True) is not flush:
        connection.exec_driver_sql("PRAGMA synchronous=FULL" if flush else "PRAGMA synchronous=NORMAL")
        connection.info[FLUSH_OPTION] = flush
    connection.exec_driver_sql("BEGIN IMMEDIATE" if options.get(WRITE_OPTION, False) else "BEGIN")
