"""Revision 0003 on both engines: the tombstones an earlier version left (deleted
responses with their whole JSON and instructions) keep no content once upgraded; visible
responses are untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import insert, text

from app.store.engines import create_engine, is_sqlite, normalize_url, sqlite_path
from app.store.migrate import upgrade
from app.store.schema import dumps_json, responses
from app.store.sql import SqlResponseStore
from tests.store.helpers import new_id, resource

pytestmark = pytest.mark.anyio


async def test_tombstones_left_by_an_earlier_version_are_cleared(database_url: str) -> None:
    normalized = normalize_url(database_url)
    if is_sqlite(normalized):
        Path(sqlite_path(normalized)).parent.mkdir(parents=True, exist_ok=True)
    deleted, visible = new_id("resp"), new_id("resp")
    engine = create_engine(normalized, pool_size=1)
    try:
        await upgrade(engine, target="0002")
        async with engine.begin() as connection:
            for response_id, deleted_at in ((deleted, 5), (visible, None)):
                await connection.execute(insert(responses).values(
                    id=response_id, tenant="anonymous", status="completed", created_at=1_760_000_000,
                    model="test-model", instructions="the developer's instructions", tools=[],
                    resource=resource(response_id, status="completed"), background=False,
                    owner="earlier-version", updated_at=0, finished_at=0, deleted_at=deleted_at,
                ))
    finally:
        await engine.dispose()

    store = SqlResponseStore(database_url, "upgrader")
    await store.open()
    try:
        async with store.engine.connect() as connection:
            rows = {row.id: row for row in await connection.execute(
                text("SELECT id, resource, instructions FROM responses"))}
        # the same text the server writes when it deletes
        assert rows[deleted].resource == dumps_json({"id": deleted, "object": "response", "deleted": True})
        assert rows[deleted].instructions is None
        assert json.loads(rows[visible].resource) == resource(visible, status="completed")
        assert rows[visible].instructions == "the developer's instructions"
        assert (await store.get("anonymous", visible)) is not None
    finally:
        await store.close()
