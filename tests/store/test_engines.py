"""The PostgreSQL engine's pool on the real server: a pooled connection is checked before
use only when it has been idle (``app.store.engines.ping_when_idle``)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.store.engines import ALIVE_BYPASS_SECONDS, create_engine

pytestmark = pytest.mark.anyio


def _counting_pings(engine: Any, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The real check, counted (a spy on the dialect, which still runs it)."""
    dialect = engine.sync_engine.dialect
    pings: list[object] = []
    real = dialect.do_ping

    def do_ping(dbapi_connection: object) -> bool:
        pings.append(dbapi_connection)
        return real(dbapi_connection)  # type: ignore[no-any-return]

    monkeypatch.setattr(dialect, "do_ping", do_ping)
    return pings


async def _backend_pid(engine: Any) -> int:
    async with engine.connect() as connection:
        return int(await connection.scalar(text("SELECT pg_backend_pid()")))


async def test_a_connection_returned_moments_ago_is_used_without_a_check(
        postgres_database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = create_engine(make_url(postgres_database_url), pool_size=1)
    try:
        pings = _counting_pings(engine, monkeypatch)
        first = await _backend_pid(engine)  # a new connection: nothing to check
        for _ in range(5):
            assert await _backend_pid(engine) == first
        assert pings == []
        await anyio.sleep(ALIVE_BYPASS_SECONDS + 0.1)
        assert await _backend_pid(engine) == first
        assert len(pings) == 1  # idle past the window: checked once
    finally:
        await engine.dispose()


async def test_a_connection_that_died_while_idle_is_replaced_before_use(postgres_database_url: str) -> None:
    engine = create_engine(make_url(postgres_database_url), pool_size=1)
    admin = create_engine(make_url(postgres_database_url), pool_size=1)
    try:
        dead = await _backend_pid(engine)
        async with admin.connect() as connection:
            assert await connection.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": dead})
        await anyio.sleep(ALIVE_BYPASS_SECONDS + 0.1)
        # the check finds it dead: another connection is taken and the statement runs
        assert await _backend_pid(engine) != dead
    finally:
        await engine.dispose()
        await admin.dispose()
