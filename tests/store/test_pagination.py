"""Cursor pagination of a response's input items."""

from __future__ import annotations

import pytest

from app.store.sql import SqlResponseStore
from tests.store.helpers import assistant_message, events_of, final, new_id, new_response, user_message

pytestmark = pytest.mark.anyio


async def with_inputs(store: SqlResponseStore, tenant: str, count: int) -> tuple[str, list[str]]:
    inputs = [user_message(f"item {n}") for n in range(count)]
    begun = new_response(tenant, inputs=inputs)
    await store.begin(begun)
    return begun.id, [item["id"] for item in inputs]


async def ids_of(store: SqlResponseStore, tenant: str, response_id: str, **query: object) -> tuple[list[str], bool]:
    page = await store.input_items(tenant, response_id, **query)  # type: ignore[arg-type]
    assert page is not None
    return [item["id"] for item in page.data], page.has_more


async def test_limit_one_walks_every_item(store: SqlResponseStore, tenant: str) -> None:
    response_id, ids = await with_inputs(store, tenant, 5)
    for order, expected in (("asc", ids), ("desc", ids[::-1])):
        seen: list[str] = []
        after = None
        while True:
            page, has_more = await ids_of(store, tenant, response_id, limit=1, order=order, after=after)
            assert len(page) == 1
            seen += page
            after = page[-1]
            if not has_more:
                break
        assert seen == expected


async def test_exact_page_boundary(store: SqlResponseStore, tenant: str) -> None:
    response_id, ids = await with_inputs(store, tenant, 6)
    assert await ids_of(store, tenant, response_id, limit=3, order="asc", after=None) == (ids[:3], True)
    assert await ids_of(store, tenant, response_id, limit=3, order="asc", after=ids[2]) == (ids[3:], False)
    assert await ids_of(store, tenant, response_id, limit=6, order="asc", after=None) == (ids, False)
    assert await ids_of(store, tenant, response_id, limit=5, order="asc", after=None) == (ids[:5], True)
    assert await ids_of(store, tenant, response_id, limit=3, order="desc", after=None) == (ids[:2:-1], True)
    assert await ids_of(store, tenant, response_id, limit=3, order="desc", after=ids[3]) == (ids[2::-1], False)
    assert await ids_of(store, tenant, response_id, limit=3, order="asc", after=ids[-1]) == ([], False)
    assert await ids_of(store, tenant, response_id, limit=3, order="desc", after=ids[0]) == ([], False)


async def test_cursor_in_the_middle(store: SqlResponseStore, tenant: str) -> None:
    response_id, ids = await with_inputs(store, tenant, 10)
    assert await ids_of(store, tenant, response_id, limit=4, order="asc", after=ids[4]) == (ids[5:9], True)
    assert await ids_of(store, tenant, response_id, limit=4, order="desc", after=ids[4]) == (ids[3::-1], False)


async def test_unknown_cursor_gives_an_empty_page(store: SqlResponseStore, tenant: str) -> None:
    response_id, _ = await with_inputs(store, tenant, 3)
    other_id, other_ids = await with_inputs(store, tenant, 3)
    for after in (new_id("msg"), other_ids[0]):
        for order in ("asc", "desc"):
            assert await ids_of(store, tenant, response_id, limit=20, order=order, after=after) == ([], False)


async def test_limit_one_hundred(store: SqlResponseStore, tenant: str) -> None:
    response_id, ids = await with_inputs(store, tenant, 250)
    assert await ids_of(store, tenant, response_id, limit=100, order="asc", after=None) == (ids[:100], True)
    assert await ids_of(store, tenant, response_id, limit=100, order="asc", after=ids[199]) == (ids[200:], False)
    assert await ids_of(store, tenant, response_id, limit=100, order="desc", after=ids[100]) == (ids[99::-1], False)


async def test_no_inputs_and_absent_responses(store: SqlResponseStore, tenant: str) -> None:
    response_id, _ = await with_inputs(store, tenant, 0)
    assert await ids_of(store, tenant, response_id, limit=20, order="desc", after=None) == ([], False)
    assert await store.input_items(tenant, new_id("resp"), limit=20, order="asc", after=None) is None
    with pytest.raises(ValueError):
        await store.input_items(tenant, response_id, limit=0, order="asc", after=None)


async def test_only_input_items_are_listed(store: SqlResponseStore, tenant: str) -> None:
    begun = new_response(tenant, inputs=[user_message("in")])
    await store.begin(begun)
    output = [assistant_message("out")]
    await store.finish(tenant, begun.id, final(begun, output), output, events_of(begun.id))
    assert await ids_of(store, tenant, begun.id, limit=20, order="asc", after=None) == (
        [begun.input_items[0]["id"]], False)
