"""Many tasks at once on one store, and writes that outlive their caller."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from sqlalchemy.util import await_

from app.errors import PreviousResponseNotFound
from app.store.base import NewResponse
from app.store.sql import SqlResponseStore
from tests.store.conftest import NewStore
from tests.store.helpers import (
    assistant_message,
    events_of,
    final,
    new_response,
    on_every_engine,
    row_count,
    user_message,
)

pytestmark = pytest.mark.anyio


async def test_concurrent_begins_and_finishes(store: SqlResponseStore, tenant: str) -> None:
    begun = [new_response(tenant, inputs=[user_message(f"task {n} item {k}") for k in range(3)]) for n in range(60)]

    async def run(one: NewResponse) -> None:
        await store.begin(one)
        output = [assistant_message(f"answer {one.id}")]
        await store.finish(tenant, one.id, final(one, output), output, events_of(one.id))

    async with anyio.create_task_group() as group:
        for one in begun:
            group.start_soon(run, one)

    for one in begun:
        links = await store.chain(tenant, one.id)
        assert links is not None and links[0].input_items == one.input_items
        assert links[0].output_items[0]["content"][0]["text"] == f"answer {one.id}"
    assert await row_count(store, "items") == 60 * 4


async def test_concurrent_continuations_of_one_response(store: SqlResponseStore, tenant: str) -> None:
    root = new_response(tenant)
    await store.begin(root)
    await store.finish(tenant, root.id, final(root, []), [], events_of(root.id))
    children = [new_response(tenant, previous=root.id) for _ in range(30)]
    async with anyio.create_task_group() as group:
        for child in children:
            group.start_soon(store.begin, child)
    for child in children:
        links = await store.chain(tenant, child.id)
        assert links is not None and [link.response_id for link in links] == [root.id, child.id]


async def test_delete_racing_continuations_never_strands_a_child(store: SqlResponseStore, tenant: str) -> None:
    """A continuation commits before the delete (and then keeps the parent's items) or
    fails with previous_response_not_found: never a child whose context was removed."""
    for _ in range(5):
        parent = new_response(tenant, inputs=[user_message("parent question")])
        await store.begin(parent)
        output = [assistant_message("parent answer")]
        await store.finish(tenant, parent.id, final(parent, output), output, events_of(parent.id))
        children = [new_response(tenant, previous=parent.id) for _ in range(12)]
        outcomes: dict[str, bool] = {}

        async def continue_from(child: NewResponse, outcomes: dict[str, bool] = outcomes) -> None:
            try:
                await store.begin(child)
                outcomes[child.id] = True
            except PreviousResponseNotFound:
                outcomes[child.id] = False

        async with anyio.create_task_group() as group:
            for index, child in enumerate(children):
                group.start_soon(continue_from, child)
                if index == len(children) // 2:
                    group.start_soon(store.delete, tenant, parent.id)

        assert await store.get(tenant, parent.id) is None
        survivors = [child for child in children if outcomes[child.id]]
        for child in survivors:
            links = await store.chain(tenant, child.id)
            assert links is not None and len(links) == 2
            assert links[0].input_items == parent.input_items and links[0].output_items == output
        for child in children:
            if not outcomes[child.id]:
                assert await store.get(tenant, child.id) is None
        expected_parent_items = 2 if survivors else 0
        assert await row_count(store, "items", parent.id) == expected_parent_items


@pytest.mark.parametrize("batch", [False, True], ids=["alone", "in a batch"])
async def test_delete_between_a_continuations_check_and_its_commit(
    store: SqlResponseStore, tenant: str, batch: bool
) -> None:
    """The continuation is paused right after it found its parent visible, and the
    parent is deleted meanwhile: the delete must wait (or see the child), never remove
    the items the child's context needs. Alone, the continuation's one statement is its
    own transaction (it has committed when it pauses); in a batch with another write, the
    batch's transaction is still open, holding the parent, while it pauses.

    PostgreSQL only: SQLite's writer thread runs writes one at a time, each whole, so a
    delete cannot come between a continuation's check and its commit there."""
    if store.is_sqlite:
        pytest.skip("SQLite's one writer runs each write whole; nothing can come in between")
    parent = new_response(tenant, inputs=[user_message("parent question")])
    await store.begin(parent)
    output = [assistant_message("parent answer")]
    await store.finish(tenant, parent.id, final(parent, output), output, events_of(parent.id))
    child = new_response(tenant, previous=parent.id)
    # The pause happens where the statement runs: inside the event loop (a greenlet that
    # can await).
    checked, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        with anyio.move_on_after(1.0):  # a delete that waits for the lock cannot release it
            while not release.is_set():
                await asyncio.sleep(0.01)

    # The continuation's one statement checks its parent, holds it (FOR SHARE) and writes
    # the child; it is paused right after it ran (SQLAlchemy's after_cursor_execute event).
    def pause_after_parent_check(connection, cursor, operation, parameters, *rest):  # type: ignore[no-untyped-def]
        if not checked.is_set() and "FOR SHARE" in operation and parent.id in str(parameters):
            checked.set()
            await_(hold())

    with on_every_engine("after_cursor_execute", pause_after_parent_check):
        async with anyio.create_task_group() as group:
            group.start_soon(store.begin, child)
            if batch:  # queued in the same turn of the loop: one writer takes both
                group.start_soon(store.begin, new_response(tenant))
            with anyio.fail_after(30):
                while not checked.is_set():
                    await asyncio.sleep(0.01)

            async def delete_then_release() -> None:
                assert await store.delete(tenant, parent.id)
                release.set()

            group.start_soon(delete_then_release)

    links = await store.chain(tenant, child.id)
    assert links is not None and [link.response_id for link in links] == [parent.id, child.id]
    assert links[0].input_items == parent.input_items and links[0].output_items == output


async def test_a_write_survives_its_callers_cancellation(store: SqlResponseStore, tenant: str) -> None:
    begun = new_response(tenant)
    await store.begin(begun)
    output = [assistant_message("written anyway")]
    caller = asyncio.ensure_future(store.finish(tenant, begun.id, final(begun, output), output, events_of(begun.id)))
    await asyncio.sleep(0)  # the transaction has started
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    with anyio.fail_after(10):
        while (stored := await store.get(tenant, begun.id)) is not None and stored.status != "completed":
            await anyio.sleep(0.01)
    assert await store.events(tenant, begun.id) == events_of(begun.id)


async def test_close_waits_for_writes_in_flight(new_store: NewStore, tenant: str) -> None:
    store = await new_store("closing")
    begun = new_response(tenant)
    await store.begin(begun)
    caller = asyncio.ensure_future(store.finish(tenant, begun.id, final(begun, []), [], events_of(begun.id)))
    await asyncio.sleep(0)
    caller.cancel()
    await store.close()
    reopened = await new_store("reopened")
    stored = await reopened.get(tenant, begun.id)
    assert stored is not None and stored.status == "completed"
