"""PostgreSQL writes a response's row, items and events in one statement
(``app.store.one_statement``); an end that comes too late writes nothing, on both engines.
On the real PostgreSQL server; the statements a write sends are recorded by SQLAlchemy's
``before_cursor_execute`` event (``BEGIN`` and ``COMMIT`` are the driver's own)."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from app.store.sql import SqlResponseStore
from tests.store.helpers import assistant_message, events_of, final, new_response, on_every_engine, row_count

pytestmark = pytest.mark.anyio

TABLES = ("responses", "items", "events")


def _writes(statements: list[str]) -> list[str]:
    """The statements that touch the store's tables (not pings)."""
    return [sql for sql in statements if any(table in sql for table in TABLES)]


async def test_each_write_of_a_stored_stream_is_one_statement(postgres_database_url: str, tenant: str) -> None:
    store = SqlResponseStore(postgres_database_url, secrets.token_hex(8))
    await store.open()
    statements: list[str] = []

    def sent(connection: Any, cursor: Any, statement: str, *rest: Any) -> None:
        statements.append(statement)

    try:
        with on_every_engine("before_cursor_execute", sent):
            begun = new_response(tenant)
            await store.begin(begun)
            (start,) = _writes(statements)
            assert "INSERT INTO responses" in start and "INSERT INTO items" in start

            statements.clear()
            output = [assistant_message("done")]
            assert await store.finish(tenant, begun.id, final(begun, output), output, events_of(begun.id))
            (end,) = _writes(statements)
            assert "UPDATE responses" in end and "INSERT INTO items" in end and "INSERT INTO events" in end

            statements.clear()
            whole = new_response(tenant, previous=begun.id)
            assert await store.record(whole, final(whole, output), output, events_of(whole.id))
            (record,) = _writes(statements)  # a continuation: its previous response held in the same statement
            assert "FOR SHARE" in record and "INSERT INTO responses" in record and "INSERT INTO events" in record

        stored = await store.get(tenant, begun.id)
        assert stored is not None and stored.status == "completed"
        assert await store.events(tenant, begun.id) == events_of(begun.id)
        assert await _rows(store, begun.id) == {"output items": 1, "events": 1}
        assert await _rows(store, whole.id) == {"output items": 1, "events": 1}
    finally:
        await store.close()


@pytest.mark.parametrize("how", ["deleted", "cancelled"])
async def test_an_end_that_comes_too_late_writes_no_items_and_no_events(
    store: SqlResponseStore, tenant: str, how: str
) -> None:
    begun = new_response(tenant, background=True)
    await store.begin(begun)
    if how == "deleted":
        assert await store.delete(tenant, begun.id)
    else:
        assert await store.cancel(tenant, begun.id) is not None
    output = [assistant_message("late")]
    assert not await store.finish(tenant, begun.id, final(begun, output), output, events_of(begun.id))
    assert await _rows(store, begun.id) == {"output items": 0, "events": 0}


async def _rows(store: SqlResponseStore, response_id: str) -> dict[str, int]:
    return {"output items": await row_count(store, "items", response_id, role="output"),
            "events": await row_count(store, "events", response_id)}
