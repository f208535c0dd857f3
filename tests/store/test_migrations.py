"""The schema comes from alembic migrations, applied at open; applying them again is a
no-op; the migrated database is exactly the schema module's tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import event, inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

import app.store.sql as sql_module
from app.store.engines import normalize_url, sqlite_url
from app.store.migrate import head_revision
from app.store.schema import metadata
from app.store.sql import SqlResponseStore
from tests.store.conftest import NewStore

pytestmark = pytest.mark.anyio


def differences(connection: Connection) -> list[object]:
    context = MigrationContext.configure(connection, opts={"compare_type": True, "compare_server_default": True})
    return list(compare_metadata(context, metadata))


def index_names(connection: Connection) -> set[str]:
    inspector = inspect(connection)
    return {str(index["name"]) for table in metadata.tables for index in inspector.get_indexes(table)}


async def test_migrated_database_is_the_schema(store: SqlResponseStore) -> None:
    async with store.engine.connect() as connection:
        assert await connection.run_sync(differences) == []
        assert (await connection.scalars(text("SELECT version_num FROM alembic_version"))).all() == [head_revision()]
        indexes = await connection.run_sync(index_names)
    # each index is a page more for every write to touch: only those some query needs
    # (a conversation's item by its id: GET and DELETE of one item, the ``after`` cursor, each id once)
    assert indexes == {"ix_responses_previous_response_id", "ix_responses_unfinished_owner",
                       "ix_conversation_items_conversation_id_item_id"}


async def test_second_open_is_a_no_op(
    database_url: str, new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await new_store("first")
    await first.close()
    statements: list[str] = []
    create_engine = sql_module.create_engine

    def recording_engine(*args: Any, **kwargs: Any) -> AsyncEngine:
        engine = create_engine(*args, **kwargs)
        event.listen(engine.sync_engine, "before_cursor_execute",
                     lambda conn, cursor, statement, *rest: statements.append(statement))
        return engine

    monkeypatch.setattr(sql_module, "create_engine", recording_engine)
    second = await new_store("second")
    writes = [s for s in statements if s.lstrip().upper().startswith(("CREATE", "ALTER", "DROP", "INSERT", "UPDATE"))]
    assert writes == []
    async with second.engine.connect() as connection:
        assert (await connection.scalars(text("SELECT version_num FROM alembic_version"))).all() == [head_revision()]


async def test_replicas_starting_together_migrate_once(postgres_database_url: str) -> None:
    stores = [SqlResponseStore(postgres_database_url, f"replica-{n}") for n in range(6)]
    try:
        async with anyio.create_task_group() as group:
            for store in stores:
                group.start_soon(store.open)
        async with stores[0].engine.connect() as connection:
            assert await connection.run_sync(differences) == []
    finally:
        for store in stores:
            await store.close()


async def test_sqlite_runs_in_wal_with_full_sync(tmp_path: Path) -> None:
    store = SqlResponseStore(sqlite_url(tmp_path / "deep" / "dir" / "ors.db"), "pragmas")
    await store.open()
    try:
        async with store.engine.connect() as connection:
            assert await connection.scalar(text("PRAGMA journal_mode")) == "wal"
            assert await connection.scalar(text("PRAGMA synchronous")) == 2  # FULL
            assert await connection.scalar(text("PRAGMA foreign_keys")) == 1
            assert await connection.scalar(text("PRAGMA busy_timeout")) >= 1000
    finally:
        await store.close()
    assert (tmp_path / "deep" / "dir" / "ors.db").exists()


def test_urls_are_normalized_and_memory_is_refused() -> None:
    assert normalize_url("postgresql://u@h/db").drivername == "postgresql+asyncpg"
    assert normalize_url("postgres://u@h/db").drivername == "postgresql+asyncpg"
    assert normalize_url("sqlite:///x/ors.db").drivername == "sqlite+aiosqlite"
    for refused in ("sqlite://", "sqlite:///:memory:", "mysql://u@h/db", "postgresql+psycopg://u@h/db"):
        with pytest.raises(ValueError):
            normalize_url(refused)


async def test_postgresql_statements_get_custom_plans(postgres_database_url: str) -> None:
    """Generic plans of the chain's recursive CTE, chosen while the tables are small,
    scan the whole table at every step; the store's sessions must plan each execution."""
    store = SqlResponseStore(postgres_database_url, "plans")
    await store.open()
    try:
        async with store.engine.connect() as connection:
            assert await connection.scalar(text("SHOW plan_cache_mode")) == "force_custom_plan"
    finally:
        await store.close()
