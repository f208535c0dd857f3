"""The write path's statements on the driver itself (``app.store.direct``) write what
SQLAlchemy would, on both engines: the same column text, integrity errors as
SQLAlchemy's, rows matched, and the caller's transaction."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import Text, bindparam, cast, create_engine, event, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import create_async_engine

from app.store.direct import Direct
from app.store.engines import configure_sqlite
from app.store.schema import Serialized, events, metadata, responses
from tests.store.conftest import fresh_postgres_database

pytestmark = pytest.mark.anyio

T = TypeVar("T")
Run = Callable[[Callable[[Connection], T]], Any]

INSERT = Direct(insert(responses))
FINISH = Direct(update(responses).where(responses.c.id == bindparam("b_id")))
STATUS = Direct(select(responses.c.status, responses.c.finished_at).where(responses.c.id == bindparam("b_id")))
EVENTS = Direct(insert(events))


def row(response_id: str, **changes: Any) -> dict[str, Any]:
    return {
        "id": response_id, "tenant": "t", "status": "in_progress", "created_at": 1, "model": "m",
        "previous_response_id": None, "instructions": "Be brief. ünïcode", "tools": [{"type": "function", "name": "f"}],
        "resource": Serialized(f'{{"id": "{response_id}",  "status":"in_progress"}}', "in_progress"),
        "background": False, "owner": "o", "updated_at": 2,
    } | changes


@pytest.fixture(params=["sqlite", "postgresql"])
async def run(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Run[Any]]:
    """Run a function of a connection in one transaction of a fresh database."""
    if request.param == "sqlite":
        engine = create_engine(f"sqlite:///{tmp_path / 'direct.db'}")
        event.listen(engine, "connect", configure_sqlite)
        event.listen(engine, "begin", lambda connection: connection.exec_driver_sql("BEGIN"))
        metadata.create_all(engine)

        async def sync(fn: Callable[[Connection], T]) -> T:
            with engine.begin() as connection:
                return fn(connection)

        yield sync
        engine.dispose()
        return
    async with fresh_postgres_database() as url:
        async_engine = create_async_engine(url)
        async with async_engine.begin() as connection:
            await connection.run_sync(metadata.create_all)

        async def through(fn: Callable[[Connection], T]) -> T:
            async with async_engine.begin() as connection:
                return await connection.run_sync(fn)

        yield through
        await async_engine.dispose()


def stored_text(connection: Connection, response_id: str) -> tuple[Any, ...]:
    """The JSON columns as the database holds them (text, not parsed)."""
    query = select(cast(responses.c.tools, Text), cast(responses.c.resource, Text), responses.c.background)
    found = connection.execute(query.where(responses.c.id == response_id)).first()
    assert found is not None
    return tuple(found)


async def test_a_row_is_written_as_sqlalchemy_writes_it(run: Run[Any]) -> None:
    await run(lambda connection: INSERT.execute(connection, row("direct")))
    await run(lambda connection: connection.execute(insert(responses), row("core")))
    direct = await run(lambda connection: stored_text(connection, "direct"))
    core = await run(lambda connection: stored_text(connection, "core"))
    assert direct[0] == core[0] == '[{"type":"function","name":"f"}]'
    assert direct[1] == '{"id": "direct",  "status":"in_progress"}'  # a serialized document as it is
    assert direct[2] == core[2]


async def test_several_rows_at_once_and_binary_values(run: Run[Any]) -> None:
    def write(connection: Connection) -> int:
        INSERT.execute(connection, [row("a"), row("b")])
        return EVENTS.execute(connection, {"response_id": "a", "body": b"\x00\xffevents"})

    assert await run(write) == 1
    body = await run(lambda connection: connection.scalar(select(events.c.body)))
    assert bytes(body) == b"\x00\xffevents"
    assert await run(lambda connection: INSERT.execute(connection, [])) == 0


async def test_a_duplicate_is_sqlalchemys_integrity_error(run: Run[Any]) -> None:
    await run(lambda connection: INSERT.execute(connection, row("twice")))
    with pytest.raises(IntegrityError):
        await run(lambda connection: INSERT.execute(connection, row("twice")))


async def test_an_update_counts_the_rows_it_matched_and_a_query_gives_a_tuple(run: Run[Any]) -> None:
    await run(lambda connection: INSERT.execute(connection, row("r")))
    values = {"status": "completed", "resource": {"status": "completed"}, "updated_at": 3, "finished_at": 3}
    assert await run(lambda connection: FINISH.execute(connection, {"b_id": "r"} | values)) == 1
    assert await run(lambda connection: FINISH.execute(connection, {"b_id": "absent"} | values)) == 0
    assert await run(lambda connection: STATUS.first(connection, {"b_id": "r"})) == ("completed", 3)
    assert await run(lambda connection: STATUS.first(connection, {"b_id": "absent"})) is None


async def test_statements_run_in_the_callers_transaction(run: Run[Any]) -> None:
    class Undone(Exception):
        pass

    def write_then_fail(connection: Connection) -> None:
        INSERT.execute(connection, row("undone"))
        assert STATUS.first(connection, {"b_id": "undone"}) == ("in_progress", None)  # seen inside
        raise Undone

    with pytest.raises(Undone):
        await run(write_then_fail)
    assert await run(lambda connection: STATUS.first(connection, {"b_id": "undone"})) is None
