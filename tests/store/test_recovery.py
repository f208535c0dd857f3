"""Responses left unfinished by a dead server become failed; a live replica's do not."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio
import pytest
from sqlalchemy import text

from app.protocol.responses import ResponseResource
from app.store.base import StoreConflict
from app.store.engines import sqlite_url
from app.store.liveness import StoreInUse, instance_key
from app.store.sql import SqlResponseStore
from app.store.statements import RESTARTED_CODE
from tests.store.conftest import NewStore
from tests.store.helpers import assistant_message, events_of, final, new_id, new_response, row_count

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def assert_recovered(before: dict, after: dict) -> None:
    """``after`` is ``before`` failed with ``server_restarted``, every other field kept."""
    ResponseResource.model_validate(after)
    assert after["status"] == "failed"
    assert after["error"]["code"] == RESTARTED_CODE and after["error"]["message"]
    assert {k: v for k, v in after.items() if k not in ("status", "error")} == {
        k: v for k, v in before.items() if k not in ("status", "error")}


async def test_rows_of_a_stopped_instance_become_failed(new_store: NewStore, tenant: str) -> None:
    first = await new_store("first-life")
    running = new_response(tenant)
    queued = new_response(tenant, status="queued", background=True)
    done = new_response(tenant)
    for begun in (running, queued, done):
        await first.begin(begun)
    output = [assistant_message("done")]
    await first.finish(tenant, done.id, final(done, output), output, events_of(done.id))
    await first.close()

    second = await new_store("second-life")
    for begun in (running, queued):
        stored = await second.get(tenant, begun.id)
        assert stored is not None and stored.status == "failed"
        assert_recovered(begun.resource, stored.resource)
        links = await second.chain(tenant, begun.id)
        assert links is not None and links[-1].input_items == begun.input_items  # still continuable
    stored = await second.get(tenant, done.id)
    assert stored is not None and stored.resource == final(done, output)
    assert await second.recover() == 0
    with pytest.raises(StoreConflict):  # a recovered response has finished
        await second.finish(tenant, running.id, final(running, []), [], [])


async def test_own_running_rows_are_never_recovered(store: SqlResponseStore, tenant: str) -> None:
    begun = new_response(tenant)
    await store.begin(begun)
    assert await store.recover() == 0
    stored = await store.get(tenant, begun.id)
    assert stored is not None and stored.status == "in_progress"


async def test_sqlite_file_is_one_process_only(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "ors.db")
    first = SqlResponseStore(url, "one")
    await first.open()
    try:
        with pytest.raises(StoreInUse):
            await SqlResponseStore(url, "two").open()
    finally:
        await first.close()
    again = SqlResponseStore(url, "three")
    await again.open()
    await again.close()


async def test_live_replica_rows_are_untouched_until_it_stops(postgres_database_url: str, tenant: str) -> None:
    replica_a = SqlResponseStore(postgres_database_url, "replica-a")
    replica_b = SqlResponseStore(postgres_database_url, "replica-b", recover_interval=0.2)
    await replica_a.open()
    await replica_b.open()
    try:
        running = new_response(tenant)
        await replica_a.begin(running)
        assert await replica_b.recover() == 0
        await anyio.sleep(0.6)  # several periodic recoveries of replica b
        stored = await replica_b.get(tenant, running.id)
        assert stored is not None and stored.status == "in_progress"

        finished = new_response(tenant)
        await replica_a.begin(finished)
        await replica_a.finish(tenant, finished.id, final(finished, []), [], events_of(finished.id))

        await replica_a.close()  # stops without finishing `running`
        with anyio.fail_after(10):
            while (stored := await replica_b.get(tenant, running.id)) is not None and stored.status != "failed":
                await anyio.sleep(0.05)
        assert stored is not None
        assert_recovered(running.resource, stored.resource)
        kept = await replica_b.get(tenant, finished.id)
        assert kept is not None and kept.status == "completed"
    finally:
        await replica_a.close()
        await replica_b.close()


async def test_an_instance_id_cannot_be_opened_twice(postgres_database_url: str) -> None:
    first = SqlResponseStore(postgres_database_url, "same-id")
    await first.open()
    try:
        with pytest.raises(StoreInUse):
            await SqlResponseStore(postgres_database_url, "same-id").open()
    finally:
        await first.close()


async def test_lost_lock_connection_is_taken_again(postgres_database_url: str) -> None:
    store = SqlResponseStore(postgres_database_url, "flaky", recover_interval=0.1)
    watcher = SqlResponseStore(postgres_database_url, "watcher", recover_interval=0)
    await store.open()
    await watcher.open()
    try:
        holder = await _lock_holder(watcher, store)
        assert holder is not None
        async with watcher.engine.connect() as admin:
            await admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": holder})
        # taken again on a new connection (its periodic recovery runs every 0.1 s, so
        # the moment it is not held may be too short to see)
        with anyio.fail_after(10):
            while await _lock_holder(watcher, store) in (None, holder):
                await anyio.sleep(0.05)
    finally:
        await store.close()
        await watcher.close()


async def test_a_replica_back_from_an_outage_does_not_count_the_others_dead_at_once(
    postgres_database_url: str, tenant: str
) -> None:
    """An outage takes every replica's lock with its connection. The first replica to take
    its own back must not find another's lock free and fail its running responses: it
    recovers only at its next pass, by which time the other has its lock again."""
    running_here = SqlResponseStore(postgres_database_url, "running-here", recover_interval=0)
    other = SqlResponseStore(postgres_database_url, "other", recover_interval=0)
    await running_here.open()
    await other.open()
    try:
        running = new_response(tenant)
        await running_here.begin(running)
        holders = [await _lock_holder(other, store) for store in (running_here, other)]
        async with other.engine.connect() as admin:  # the outage, as each lock's session sees it
            for holder in holders:
                await admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": holder})
        await other.check()  # back first: its own lock again, and no judging in this pass
        stored = await other.get(tenant, running.id)
        assert stored is not None and stored.status == "in_progress"
        await running_here.check()  # takes its lock back
        await other.check()  # a pass as usual: the other is alive
        stored = await other.get(tenant, running.id)
        assert stored is not None and stored.status == "in_progress"
    finally:
        await running_here.close()
        await other.close()


def _key(store: SqlResponseStore) -> int:
    return instance_key(store.instance_id)


async def _lock_holder(watcher: SqlResponseStore, store: SqlResponseStore) -> int | None:
    """The server process (pid) that holds ``store``'s instance lock, if any."""
    async with watcher.engine.connect() as connection:
        return await connection.scalar(text(  # type: ignore[no-any-return]
            "SELECT min(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = :key"), {"key": _key(store)})


async def test_kill_9_before_finish(database_url: str, new_store: NewStore, tenant: str) -> None:
    """A server process killed mid-response: after a restart the response is failed,
    the database is consistent, and what was finished before is intact."""
    finished_id, running_id = new_id("resp"), new_id("resp")
    child = await anyio.run_process(
        [sys.executable, "-m", "tests.store.crash_child", database_url, "doomed", tenant, finished_id, running_id],
        cwd=ROOT, check=False,
    )
    assert child.returncode == -9, child.stderr.decode()
    assert child.stdout.decode().split() == ["running"]

    store = await new_store("after-the-crash")
    started = time.monotonic()
    while (stored := await store.get(tenant, running_id)) is not None and stored.status != "failed":
        assert time.monotonic() - started < 60, "the dead instance's lock was never released"  # a bound
        await anyio.sleep(0.05)
        await store.recover()  # on PostgreSQL the server may notice the dead session a moment later
    assert stored is not None
    expected = new_response(tenant, response_id=running_id, previous=finished_id)
    assert_recovered(expected.resource, stored.resource)
    links = await store.chain(tenant, running_id)
    assert links is not None and [link.response_id for link in links] == [finished_id, running_id]
    assert [item["content"] for item in links[1].input_items] == [item["content"] for item in expected.input_items]
    assert links[1].output_items == []

    kept = await store.get(tenant, finished_id)
    assert kept is not None and kept.status == "completed"
    assert await store.events(tenant, finished_id) == events_of(finished_id)
    assert links[0].output_items[0]["content"][0]["text"] == "kept"
    assert await row_count(store, "responses") == 2
    if store.is_sqlite:
        async with store.engine.connect() as connection:
            assert await connection.scalar(text("PRAGMA integrity_check")) == "ok"
            assert await connection.scalar(text("PRAGMA foreign_key_check")) is None
