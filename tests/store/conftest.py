"""Stores on both engines: a SQLite file in a temporary directory, and a fresh database
on the real PostgreSQL server for every test, dropped afterwards even when the test
fails. PostgreSQL being unreachable is an error, never a skip."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from app.store.engines import sqlite_url
from app.store.sql import SqlResponseStore

POSTGRES_ADMIN_URL = os.environ.get("ORS_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")

NewStore = Callable[..., Awaitable[SqlResponseStore]]


@asynccontextmanager
async def fresh_postgres_database() -> AsyncIterator[str]:
    """A new, empty database ``ors_test_<random>``; its URL."""
    admin = make_url(POSTGRES_ADMIN_URL)
    name = f"ors_test_{secrets.token_hex(8)}"
    dsn = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        connection = await asyncpg.connect(dsn)
    except (OSError, asyncpg.PostgresError) as error:
        pytest.fail(f"PostgreSQL at {admin.render_as_string()} is not reachable ({error!r}); the store's "
                    "PostgreSQL tests need it (ORS_TEST_POSTGRES_URL names another server).")
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    try:
        yield admin.set(drivername="postgresql+asyncpg", database=name).render_as_string(hide_password=False)
    finally:
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await connection.close()


@pytest.fixture(params=["sqlite", "postgresql"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield sqlite_url(tmp_path / "data" / "ors.db")
        return
    async with fresh_postgres_database() as url:
        yield url


@pytest.fixture()
async def postgres_database_url() -> AsyncIterator[str]:
    async with fresh_postgres_database() as url:
        yield url


@pytest.fixture()
async def new_store(database_url: str) -> AsyncIterator[NewStore]:
    """Opens stores on the test database (a new instance id each unless given), and
    closes those still open at the end."""
    opened: list[SqlResponseStore] = []

    async def open_one(instance_id: str | None = None) -> SqlResponseStore:
        store = SqlResponseStore(database_url, instance_id or secrets.token_hex(8))
        await store.open()
        opened.append(store)
        return store

    yield open_one
    for store in reversed(opened):
        await store.close()


@pytest.fixture()
async def store(new_store: NewStore) -> SqlResponseStore:
    return await new_store()


@pytest.fixture()
def tenant() -> str:
    return f"tenant_{secrets.token_hex(4)}"
