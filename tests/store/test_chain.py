"""Chains: each response keeps only its own items; the context is the walk up the chain."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from sqlalchemy import text

from app.errors import PreviousResponseNotFound
from app.store.base import NewResponse
from app.store.sql import SqlResponseStore
from tests.store.helpers import (
    assistant_message,
    events_of,
    final,
    function_tool,
    new_response,
    row_count,
    user_message,
)

pytestmark = pytest.mark.anyio


async def turn(store: SqlResponseStore, tenant: str, previous: str | None, label: str,
               instructions: str | None = None) -> NewResponse:
    begun = new_response(tenant, previous=previous, tools=[function_tool(f"tool_{label}")],
                         inputs=[user_message(f"{label} question 1"), user_message(f"{label} question 2")])
    if instructions is not None:
        begun = dataclasses.replace(begun, instructions=instructions)
    await store.begin(begun)
    output = [assistant_message(f"{label} answer")]
    await store.finish(tenant, begun.id, final(begun, output), output, events_of(begun.id))
    return begun


async def test_three_links_oldest_first_with_their_own_items(store: SqlResponseStore, tenant: str) -> None:
    one = await turn(store, tenant, None, "one")
    two = await turn(store, tenant, one.id, "two")
    three = await turn(store, tenant, two.id, "three")

    links = await store.chain(tenant, three.id)
    assert links is not None
    assert [link.response_id for link in links] == [one.id, two.id, three.id]
    for link, begun, label in zip(links, (one, two, three), ("one", "two", "three"), strict=True):
        assert link.input_items == begun.input_items
        assert [item["content"][0]["text"] for item in link.output_items] == [f"{label} answer"]
        assert link.tools == [function_tool(f"tool_{label}")]
    middle = await store.chain(tenant, two.id)
    assert middle is not None and [link.response_id for link in middle] == [one.id, two.id]
    assert await row_count(store, "items") == 9  # nothing copied from ancestors


async def test_a_chain_may_branch(store: SqlResponseStore, tenant: str) -> None:
    root = await turn(store, tenant, None, "root")
    left = await turn(store, tenant, root.id, "left")
    right = await turn(store, tenant, root.id, "right")
    for branch in (left, right):
        links = await store.chain(tenant, branch.id)
        assert links is not None and [link.response_id for link in links] == [root.id, branch.id]


async def test_a_deleted_response_has_no_chain(store: SqlResponseStore, tenant: str) -> None:
    one = await turn(store, tenant, None, "one")
    two = await turn(store, tenant, one.id, "two")
    assert await store.delete(tenant, two.id) is True
    assert await store.chain(tenant, two.id) is None
    assert await store.get(tenant, two.id) is None
    assert await store.events(tenant, two.id) is None
    assert await store.input_items(tenant, two.id, limit=10, order="asc", after=None) is None
    assert await store.delete(tenant, two.id) is False
    with pytest.raises(PreviousResponseNotFound):
        await store.begin(new_response(tenant, previous=two.id))
    # the last turn had no descendants: its items and events are gone, the rest stays
    assert await row_count(store, "items", two.id) == 0
    assert await row_count(store, "events", two.id) == 0
    assert await row_count(store, "items", one.id) == 3


async def test_descendants_of_a_deleted_middle_link_keep_their_context(store: SqlResponseStore, tenant: str) -> None:
    one = await turn(store, tenant, None, "one")
    two = await turn(store, tenant, one.id, "two")
    three = await turn(store, tenant, two.id, "three")
    assert await store.delete(tenant, two.id) is True

    assert await store.chain(tenant, two.id) is None
    links = await store.chain(tenant, three.id)
    assert links is not None
    assert [link.response_id for link in links] == [one.id, two.id, three.id]
    assert links[1].input_items == two.input_items and len(links[1].output_items) == 1
    assert await row_count(store, "events", two.id) == 0  # events are never needed by descendants
    assert await row_count(store, "items", two.id) == 3


async def test_items_go_with_the_last_response_that_needs_them(store: SqlResponseStore, tenant: str) -> None:
    one = await turn(store, tenant, None, "one")
    two = await turn(store, tenant, one.id, "two")
    left = await turn(store, tenant, two.id, "left")
    right = await turn(store, tenant, two.id, "right")

    assert await store.delete(tenant, one.id)
    assert await store.delete(tenant, two.id)
    assert await row_count(store, "items", one.id) == 3 and await row_count(store, "items", two.id) == 3

    assert await store.delete(tenant, left.id)
    assert await row_count(store, "items", left.id) == 0
    assert await row_count(store, "items", two.id) == 3  # right still needs one and two
    links = await store.chain(tenant, right.id)
    assert links is not None and [link.response_id for link in links] == [one.id, two.id, right.id]

    assert await store.delete(tenant, right.id)
    assert await row_count(store, "items") == 0
    assert await row_count(store, "events") == 0
    assert await row_count(store, "responses") == 4  # hidden tombstones


async def raw_row(store: SqlResponseStore, response_id: str) -> Any:
    """The stored text of a response's row, read past the store's API."""
    async with store.engine.connect() as connection:
        return (await connection.execute(text("SELECT resource, instructions, tools FROM responses WHERE id = :id"),
                                         {"id": response_id})).one()


async def test_a_deleted_response_keeps_no_content_beyond_what_a_visible_chain_needs(
    store: SqlResponseStore, tenant: str
) -> None:
    one = await turn(store, tenant, None, "one", instructions="one's own instructions")
    two = await turn(store, tenant, one.id, "two")
    assert "one answer" in (await raw_row(store, one.id)).resource
    assert await store.delete(tenant, one.id)

    row = await raw_row(store, one.id)
    assert row.resource == f'{{"id":"{one.id}","object":"response","deleted":true}}'
    assert row.instructions is None
    # two's context still has one's items, and the gate still knows the tools one offered
    assert "tool_one" in row.tools and await row_count(store, "items", one.id) == 3
    links = await store.chain(tenant, two.id)
    assert links is not None and links[0].tools == one.tools

    assert await store.delete(tenant, two.id)  # now nothing needs either
    for response_id in (one.id, two.id):
        row = await raw_row(store, response_id)
        assert row.resource == f'{{"id":"{response_id}","object":"response","deleted":true}}'
        assert row.tools == "[]" and row.instructions is None
    assert await row_count(store, "items") == 0 and await row_count(store, "events") == 0
