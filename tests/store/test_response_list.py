"""The tenant's stored responses listed a page at a time (``GET /v1/responses``)."""

from __future__ import annotations

import asyncio

import pytest

from app.engine.ids import response_id
from app.store.sql import SqlResponseStore
from tests.store.helpers import new_id, new_response

pytestmark = pytest.mark.anyio


async def responses_of(store: SqlResponseStore, tenant: str, count: int) -> list[str]:
    """``count`` responses begun one after another, oldest first (each id made in a
    millisecond of its own: ids made in one millisecond have no order among them)."""
    ids = []
    for _ in range(count):
        await asyncio.sleep(0.002)
        begun = new_response(tenant, response_id=response_id())
        await store.begin(begun)
        ids.append(begun.id)
    return ids


async def page_of(store: SqlResponseStore, tenant: str, **query: object) -> tuple[list[str], bool]:
    page = await store.responses(tenant, **query)  # type: ignore[arg-type]
    return [resource["id"] for resource in page.data], page.has_more


async def test_pages_walk_every_response_in_both_orders(store: SqlResponseStore) -> None:
    tenant = new_id("tenant")
    ids = await responses_of(store, tenant, 7)
    for order, expected in (("asc", ids), ("desc", ids[::-1])):
        seen: list[str] = []
        after = None
        while True:
            page, has_more = await page_of(store, tenant, limit=3, order=order, after=after)
            seen += page
            if not has_more:
                break
            after = page[-1]
        assert seen == expected


async def test_deleted_and_other_tenants_responses_are_not_listed(store: SqlResponseStore) -> None:
    tenant, other = new_id("tenant"), new_id("tenant")
    ids = await responses_of(store, tenant, 4)
    theirs = await responses_of(store, other, 2)
    assert await store.delete(tenant, ids[1])
    assert await page_of(store, tenant, limit=20, order="desc", after=None) == ([ids[3], ids[2], ids[0]], False)
    assert await page_of(store, other, limit=20, order="asc", after=None) == (theirs, False)


async def test_a_cursor_that_is_not_among_them_gives_an_empty_page(store: SqlResponseStore) -> None:
    tenant, other = new_id("tenant"), new_id("tenant")
    ids = await responses_of(store, tenant, 3)
    theirs = await responses_of(store, other, 1)
    assert await store.delete(tenant, ids[0])
    for after in (new_id("resp"), theirs[0], ids[0]):
        for order in ("asc", "desc"):
            assert await page_of(store, tenant, limit=20, order=order, after=after) == ([], False)
    assert await page_of(store, tenant, limit=1, order="desc", after=ids[2]) == ([ids[1]], False)


async def test_a_tenant_with_nothing_stored_gets_an_empty_page(store: SqlResponseStore) -> None:
    assert await page_of(store, new_id("tenant"), limit=5, order="desc", after=None) == ([], False)
    with pytest.raises(ValueError):
        await store.responses(new_id("tenant"), limit=0, order="asc", after=None)
