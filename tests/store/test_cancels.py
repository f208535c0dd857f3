"""Cancels recorded in the store and noticed by every process sharing it, on both engines
(PostgreSQL: ``LISTEN/NOTIFY`` between two stores, as two replicas)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from app.store import listener
from app.store.sql import SqlResponseStore
from compliance import check_response
from tests.store.helpers import assistant_message, events_of, final, new_id, new_response

pytestmark = pytest.mark.anyio


class Noticed:
    """Collects notices; awaits the next one (no timing: woken by the callback)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self._changed = asyncio.Event()

    def __call__(self, tenant: str, response_id: str) -> None:
        self.seen.append((tenant, response_id))
        self._changed.set()

    async def wait_for(self, notice: tuple[str, str]) -> None:
        while notice not in self.seen:
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), timeout=60)


async def test_cancel_records_and_the_run_finish_writes_nothing(store: SqlResponseStore, tenant: str) -> None:
    noticed = Noticed()
    await store.watch_cancels(noticed)
    begun = new_response(tenant, background=True)
    await store.begin(begun)
    cancelled = await store.cancel(tenant, begun.id)
    assert cancelled is not None and cancelled.status == "cancelled"
    check_response(cancelled.resource)
    assert cancelled.resource["status"] == "cancelled" and cancelled.resource["incomplete_details"] is None
    await noticed.wait_for((tenant, begun.id))
    await store.finish(tenant, begun.id, final(begun, [assistant_message("late")]), [assistant_message("late")],
                       events_of(begun.id))
    stored = await store.get(tenant, begun.id)
    assert stored is not None and stored.resource == cancelled.resource
    again = await store.cancel(tenant, begun.id)
    assert again is not None and again.resource == cancelled.resource
    assert noticed.seen.count((tenant, begun.id)) == 1  # nothing new was cancelled


async def test_a_finished_response_is_returned_unchanged(store: SqlResponseStore, tenant: str) -> None:
    noticed = Noticed()
    await store.watch_cancels(noticed)
    begun = new_response(tenant, background=True)
    await store.begin(begun)
    done = final(begun, [assistant_message("done")])
    await store.finish(tenant, begun.id, done, [assistant_message("done")], events_of(begun.id))
    stored = await store.cancel(tenant, begun.id)
    assert stored is not None and stored.status == "completed" and stored.resource == done
    assert noticed.seen == []


async def test_absent_or_foreign_responses_are_not_cancelled(store: SqlResponseStore, tenant: str) -> None:
    begun = new_response(tenant, background=True)
    await store.begin(begun)
    assert await store.cancel(tenant, new_id("resp")) is None
    assert await store.cancel("someone-else", begun.id) is None
    stored = await store.get(tenant, begun.id)
    assert stored is not None and stored.status == "in_progress"


async def test_another_replica_is_told(postgres_database_url: str, tenant: str) -> None:
    generating = SqlResponseStore(postgres_database_url, "replica-1")
    receiving = SqlResponseStore(postgres_database_url, "replica-2")
    await generating.open()
    await receiving.open()
    try:
        noticed = Noticed()
        await generating.watch_cancels(noticed)
        begun = new_response(tenant, background=True)
        await generating.begin(begun)
        await receiving.cancel(tenant, begun.id)
        await noticed.wait_for((tenant, begun.id))
    finally:
        await receiving.close()
        await generating.close()


async def test_cancels_missed_while_the_listener_was_down_are_replayed(
    postgres_database_url: str, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listening connection drops; a cancel commits before it is back; the replay
    after reconnecting delivers it. Reconnection is held until the cancel committed."""
    connect = asyncpg.connect
    reopen = asyncio.Event()

    async def held_connect(*args: Any, **kwargs: Any) -> Any:
        await reopen.wait()
        return await connect(*args, **kwargs)

    generating = SqlResponseStore(postgres_database_url, "replica-1")
    receiving = SqlResponseStore(postgres_database_url, "replica-2")
    await generating.open()
    await receiving.open()
    try:
        noticed = Noticed()
        await generating.watch_cancels(noticed)
        begun = new_response(tenant, background=True)
        await generating.begin(begun)
        listening = generating._notices._listener.connection  # type: ignore[union-attr]
        assert listening is not None
        monkeypatch.setattr(listener.asyncpg, "connect", held_connect)
        listening.terminate()  # the connection drops (asyncpg tells its termination listeners)
        await asyncio.sleep(0)  # they run: reconnection starts, and is held
        await receiving.cancel(tenant, begun.id)  # committed while nobody listens
        assert noticed.seen == []
        reopen.set()
        await noticed.wait_for((tenant, begun.id))
        assert generating._notices._listener.connection is not None  # type: ignore[union-attr]
    finally:
        reopen.set()
        await receiving.close()
        await generating.close()
