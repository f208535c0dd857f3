"""Revision 0002 on both engines: rows written under positional tenants (``key-<i>``)
move to the tenant of the key at index i of the list configured at the upgrade."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import insert, select, text

from app.store.engines import create_engine, is_sqlite, normalize_url, sqlite_path
from app.store.migrate import head_revision, upgrade
from app.store.schema import responses
from app.store.sql import SqlResponseStore
from app.transport.auth import ANONYMOUS, KeyAuthenticator, derived_tenant
from tests.store.helpers import new_id, resource

pytestmark = pytest.mark.anyio

KEYS = ["alice:first-secret", "second-secret"]  # key-0 and key-1 of the earlier version


async def database_at_0001(url: str, tenants: list[str]) -> dict[str, str]:
    """A database migrated to 0001 only, with one stored response per tenant; returns
    {tenant: response id}."""
    normalized = normalize_url(url)
    if is_sqlite(normalized):
        Path(sqlite_path(normalized)).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(normalized, pool_size=1)
    ids = {tenant: new_id("resp") for tenant in tenants}
    try:
        await upgrade(engine, target="0001")
        async with engine.begin() as connection:
            for tenant, response_id in ids.items():
                await connection.execute(insert(responses).values(
                    id=response_id, tenant=tenant, status="completed", created_at=1_760_000_000,
                    model="test-model", tools=[], resource=resource(response_id, status="completed"),
                    background=False, owner="earlier-version", updated_at=0, finished_at=0,
                ))
    finally:
        await engine.dispose()
    return ids


async def tenants_of(store: SqlResponseStore) -> dict[str, str]:
    async with store.engine.connect() as connection:
        return {row.id: row.tenant for row in await connection.execute(select(responses.c.id, responses.c.tenant))}


async def test_positional_rows_go_to_their_keys_tenants(database_url: str) -> None:
    ids = await database_at_0001(database_url, ["key-0", "key-1", "key-2", ANONYMOUS])
    auth = KeyAuthenticator(KEYS)
    store = SqlResponseStore(database_url, "upgrader", positional_tenants=auth.positional_tenants())
    await store.open()
    try:
        alice, second = auth.tenant("Bearer first-secret"), auth.tenant("Bearer second-secret")
        assert alice == "alice" and second == derived_tenant("second-secret")
        assert await tenants_of(store) == {
            ids["key-0"]: "alice",
            ids["key-1"]: second,
            ids["key-2"]: "key-2",  # its key was removed before the upgrade: unreachable, as before
            ids[ANONYMOUS]: ANONYMOUS,
        }
        assert (await store.get("alice", ids["key-0"])) is not None
        assert (await store.get(second, ids["key-1"])) is not None
        assert (await store.get(second, ids["key-0"])) is None
        assert (await store.get("alice", ids["key-1"])) is None
        async with store.engine.connect() as connection:
            assert (await connection.scalar(text("SELECT version_num FROM alembic_version"))) == head_revision()
    finally:
        await store.close()
    # the list reordered afterwards changes nothing
    reordered = KeyAuthenticator(list(reversed(KEYS)))
    again = SqlResponseStore(database_url, "restarted", positional_tenants=reordered.positional_tenants())
    await again.open()
    try:
        assert (await again.get(reordered.tenant("Bearer first-secret"), ids["key-0"])) is not None
        assert (await again.get(reordered.tenant("Bearer second-secret"), ids["key-1"])) is not None
    finally:
        await again.close()


async def test_without_keys_nothing_changes(database_url: str) -> None:
    ids = await database_at_0001(database_url, ["key-0", ANONYMOUS])
    store = SqlResponseStore(database_url, "anonymous", positional_tenants={})
    await store.open()
    try:
        assert await tenants_of(store) == {ids["key-0"]: "key-0", ids[ANONYMOUS]: ANONYMOUS}
    finally:
        await store.close()


async def test_an_upgrade_that_does_not_know_the_keys_refuses_and_changes_nothing(database_url: str) -> None:
    ids = await database_at_0001(database_url, ["key-0"])
    blind = SqlResponseStore(database_url, "blind")  # no mapping: the alembic command line
    with pytest.raises(RuntimeError, match="ORS_API_KEYS"):
        await blind.open()
    engine = create_engine(normalize_url(database_url), pool_size=1)
    try:
        async with engine.connect() as connection:
            assert (await connection.scalar(text("SELECT version_num FROM alembic_version"))) == "0001"
            assert (await connection.scalar(select(responses.c.tenant))) == "key-0"
    finally:
        await engine.dispose()
    informed = SqlResponseStore(database_url, "informed", positional_tenants=KeyAuthenticator(KEYS).positional_tenants())
    await informed.open()
    try:
        assert await tenants_of(informed) == {ids["key-0"]: "alice"}
    finally:
        await informed.close()
