"""Revision 0004 on both engines: the two indexes no query needs are dropped, and what
was stored before reads as it did, the ``after`` cursor of input items included."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import insert, inspect

from app.store.engines import create_engine, is_sqlite, normalize_url, sqlite_path
from app.store.migrate import upgrade
from app.store.schema import items, responses
from app.store.sql import SqlResponseStore
from tests.store.helpers import new_id, resource, user_message

pytestmark = pytest.mark.anyio

DROPPED = {"ix_responses_tenant_id", "ix_items_item_id"}


def _indexes(connection) -> set[str]:  # type: ignore[no-untyped-def]
    inspector = inspect(connection)
    return {str(index["name"]) for table in ("responses", "items") for index in inspector.get_indexes(table)}


async def test_the_indexes_go_and_what_was_stored_still_reads(database_url: str) -> None:
    normalized = normalize_url(database_url)
    if is_sqlite(normalized):
        Path(sqlite_path(normalized)).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(normalized, pool_size=1)
    response_id = new_id("resp")
    inputs = [user_message(f"question {n}", item_id=f"msg_in{n}") for n in range(5)]
    try:
        await upgrade(engine, target="0003")
        async with engine.begin() as connection:
            assert DROPPED <= await connection.run_sync(_indexes)
            # written by an earlier version (the same tables, two indexes more)
            await connection.execute(insert(responses).values(
                id=response_id, tenant="t", status="completed", created_at=1_760_000_000, model="test-model",
                tools=[], resource=resource(response_id, status="completed"), background=False,
                owner="earlier-version", updated_at=0, finished_at=0,
            ))
            await connection.execute(insert(items), [
                {"response_id": response_id, "role": "input", "position": n, "item_id": item["id"], "item": item}
                for n, item in enumerate(inputs)
            ])
    finally:
        await engine.dispose()

    store = SqlResponseStore(database_url, "upgrader")
    await store.open()  # upgrades to the head
    try:
        async with store.engine.connect() as connection:
            assert not DROPPED & await connection.run_sync(_indexes)
        stored = await store.get("t", response_id)
        assert stored is not None and stored.status == "completed"
        assert await store.get("another-tenant", response_id) is None
        page = await store.input_items("t", response_id, limit=2, order="asc", after="msg_in1")
        assert page is not None
        assert [item["id"] for item in page.data] == ["msg_in2", "msg_in3"]
        page = await store.input_items("t", response_id, limit=10, order="desc", after="msg_in2")
        assert page is not None
        assert [item["id"] for item in page.data] == ["msg_in1", "msg_in0"]
    finally:
        await store.close()
