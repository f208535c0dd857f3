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
  (SQLite's default does so in the commit that passes 1,000 pages, about every 75th
  stored response, which made a stored answer's p99 2.6 times its median instead of
  2.1); the writer does it between transactions, once its callers are answered
  (:mod:`app.store.group_commit`);
* the driver's own transaction handling is turned off and SQLAlchemy emits ``BEGIN``:
  reads run in a deferred transaction (one snapshot for all their statements), writes
  in ``BEGIN IMMEDIATE`` (the write lock is taken up front, so a transaction that reads
  before it writes cannot fail half-way with ``SQLITE_BUSY``).

PostgreSQL (several replicas, asyncpg): writes run in ``READ COMMITTED`` with explicit
row locks where they matter; reads that issue several statements run in ``REPEATABLE
READ`` so that they see one snapshot; every statement gets a custom plan (see
``POSTGRES_SETTINGS``).
"""

from __future__ import annotations

import sqlite3

from pathlib import Path
from typing import Any

from sqlalchemy import event
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
the whole table at each step (turn 200 took 25 ms instead of 7). A custom plan for each
execution costs a fraction of a millisecond and always walks the indexes."""
WRITE_OPTION = "ors_write"
"""Execution option marking a connection whose transactions write."""


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
        return create_async_engine(
            url,
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_pre_ping=True,
            connect_args={"server_settings": POSTGRES_SETTINGS},
        )
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
    )
    event.listen(engine.sync_engine, "connect", configure_sqlite)
    event.listen(engine.sync_engine, "begin", begin_sqlite)
    return engine


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
    statement = "BEGIN IMMEDIATE" if connection.get_execution_options().get(WRITE_OPTION, False) else "BEGIN"
    driver = connection.connection.driver_connection
    if isinstance(driver, sqlite3.Connection):
        # the store's own connections (reader threads, the writer process): on the
        # driver itself, as app.store.direct does
        driver.execute(statement)
    else:
        connection.exec_driver_sql(statement)
