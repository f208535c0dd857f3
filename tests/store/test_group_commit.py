"""Group commit on both engines: concurrent writes share transactions, a failing write
fails alone, queued writes hold no connection from the pool, and only a response's start
is committed without a flush."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import Connection

from app.errors import PreviousResponseNotFound
from app.store.base import StoreConflict
from app.store.engines import SQLITE_PRAGMAS, sqlite_url
from app.store.sql import SqlResponseStore
from app.store.sqlite_writer import CHECKPOINT_EVERY, SqliteWriter
from tests.store.conftest import NewStore
from tests.store.helpers import assistant_message, events_of, final, new_response

pytestmark = pytest.mark.anyio


async def test_concurrent_writes_share_commits(store: SqlResponseStore, tenant: str) -> None:
    begun = [new_response(tenant) for _ in range(200)]
    assert store._group is not None
    before = store._group.batches
    await asyncio.gather(*(store.begin(one) for one in begun))
    commits = store._group.batches - before
    assert 1 <= commits < len(begun)
    for one in begun:
        assert (await store.get(tenant, one.id)) is not None


async def test_a_failing_write_fails_alone(store: SqlResponseStore, tenant: str) -> None:
    taken = new_response(tenant)
    await store.begin(taken)
    batch = [new_response(tenant) for _ in range(30)]
    duplicate = new_response(tenant, response_id=taken.id)
    orphan = new_response(tenant, previous="resp_" + secrets.token_hex(8))
    results = await asyncio.gather(
        *(store.begin(one) for one in [*batch[:15], duplicate, orphan, *batch[15:]]), return_exceptions=True
    )
    assert isinstance(results[15], StoreConflict)
    assert isinstance(results[16], PreviousResponseNotFound)
    assert [r for i, r in enumerate(results) if i not in (15, 16)] == [None] * 30
    for one in batch:
        assert (await store.get(tenant, one.id)) is not None


async def test_a_thousand_writers_never_wait_on_the_pool(database_url: str, tenant: str) -> None:
    store = SqlResponseStore(database_url, secrets.token_hex(8), pool_size=2)
    await store.open()
    try:
        begun = [new_response(tenant) for _ in range(1000)]
        await asyncio.gather(*(store.begin(one) for one in begun))

        async def finish(one) -> None:  # type: ignore[no-untyped-def]
            output = [assistant_message("done")]
            await store.finish(tenant, one.id, final(one, output), output, events_of(one.id))

        await asyncio.gather(*(finish(one) for one in begun))
        stored = await store.get(tenant, begun[-1].id)
        assert stored is not None and stored.status == "completed"
    finally:
        await store.close()


async def test_a_cancelled_caller_does_not_cancel_its_write(new_store: NewStore, tenant: str) -> None:
    first = await new_store()
    one = new_response(tenant)
    task = asyncio.create_task(first.begin(one))
    await asyncio.sleep(0)  # the write is queued
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await first.close()  # lets queued writes finish
    second = await new_store()
    assert (await second.get(tenant, one.id)) is not None


async def test_a_write_after_close_fails_at_once(new_store: NewStore, tenant: str) -> None:
    store = await new_store()
    group = store._group
    assert group is not None
    await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        await group.run(_synchronous)
    with pytest.raises(RuntimeError, match="not open"):
        await store.begin(new_response(tenant))


async def test_record_writes_a_whole_response_in_one_commit(store: SqlResponseStore, tenant: str) -> None:
    one = new_response(tenant)
    output = [assistant_message("whole")]
    assert store._group is not None
    before = store._group.batches
    await store.record(one, final(one, output), output, events_of(one.id))
    assert store._group.batches - before == 1
    stored = await store.get(tenant, one.id)
    assert stored is not None and stored.status == "completed"
    links = await store.chain(tenant, one.id)
    assert links is not None and links[0].input_items == one.input_items and links[0].output_items == output
    assert await store.events(tenant, one.id) == events_of(one.id)


async def test_record_of_a_continuation_whose_parent_is_gone_writes_nothing(
    store: SqlResponseStore, tenant: str
) -> None:
    orphan = new_response(tenant, previous="resp_" + secrets.token_hex(8))
    output = [assistant_message("lost")]
    with pytest.raises(PreviousResponseNotFound):
        await store.record(orphan, final(orphan, output), output, events_of(orphan.id))
    assert await store.get(tenant, orphan.id) is None


# ---------------------------------------------------------------- flushed or not


def _synchronous(connection: Connection) -> str:
    """The commit's durability setting as the database sees it inside the transaction."""
    if connection.dialect.name == "sqlite":
        return {2: "flushed", 1: "unflushed"}[connection.exec_driver_sql("PRAGMA synchronous").scalar()]
    return {"on": "flushed", "off": "unflushed"}[connection.exec_driver_sql("SHOW synchronous_commit").scalar()]


def _hold_writer(connection: Connection) -> None:
    """Keeps the writer busy for a moment, so that the writes made meanwhile form one batch."""
    if connection.dialect.name == "sqlite":
        time.sleep(0.3)  # in the writer thread
    else:
        connection.exec_driver_sql("SELECT pg_sleep(0.3)")


async def test_a_write_is_flushed_unless_told_otherwise(store: SqlResponseStore) -> None:
    group = store._group
    assert group is not None
    assert await group.run(_synchronous) == "flushed"
    assert await group.run(_synchronous, flush=False) == "unflushed"
    assert await group.run(_synchronous) == "flushed"  # the setting does not stick


async def test_a_batch_with_one_write_to_flush_is_flushed_whole(store: SqlResponseStore) -> None:
    group = store._group
    assert group is not None
    holding = asyncio.create_task(group.run(_hold_writer))
    await asyncio.sleep(0.1)  # the writer has taken it
    before = group.batches
    seen = await asyncio.gather(group.run(_synchronous, flush=False), group.run(_synchronous),
                                group.run(_synchronous, flush=False))
    await holding
    assert group.batches - before == 2  # the held write's batch, then the three together
    assert seen == ["flushed"] * 3
    assert await group.run(_synchronous, flush=False) == "unflushed"  # alone again


async def test_only_starts_go_unflushed(store: SqlResponseStore, tenant: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Which of the store's writes ask for a flush, and which are one statement on
    PostgreSQL (the real writes run, observed)."""
    group = store._group
    assert group is not None
    asked: list[tuple[bool, bool]] = []
    run = group.run

    async def observed(work, *, flush: bool = True, single: bool = False):  # type: ignore[no-untyped-def]
        asked.append((flush, single))
        return await run(work, flush=flush, single=single)

    monkeypatch.setattr(group, "run", observed)

    def seen() -> list[tuple[bool, bool]]:
        taken = asked[:]
        asked.clear()
        return taken

    one = new_response(tenant)
    await store.begin(one)
    assert seen() == [(False, True)]
    await store.set_status(tenant, one.id, "in_progress", one.resource)
    assert seen() == [(False, False)]
    output = [assistant_message("done")]
    await store.finish(tenant, one.id, final(one, output), output, events_of(one.id))
    assert seen() == [(True, True)]
    whole = new_response(tenant)
    await store.record(whole, final(whole, output), output, events_of(whole.id))
    assert seen() == [(True, True)]
    queued = new_response(tenant, background=True, status="queued")
    await store.begin(queued)
    seen()
    await store.set_status(tenant, queued.id, "cancelled", queued.resource)
    assert seen() == [(True, False)]
    other = new_response(tenant, background=True, status="queued")
    await store.begin(other)
    seen()
    await store.cancel(tenant, other.id)
    assert seen() == [(True, False)]
    assert await store.delete(tenant, one.id)
    assert seen() == [(True, False)]


async def test_sqlite_commits_never_checkpoint_and_the_writer_keeps_the_wal_short(
    tmp_path: Path, tenant: str
) -> None:
    path = tmp_path / "ors.db"
    store = SqlResponseStore(sqlite_url(path), secrets.token_hex(8))
    await store.open()
    try:
        group = store._group
        assert isinstance(group, SqliteWriter)
        for _ in range(6 * CHECKPOINT_EVERY):  # one commit each, about 49 KB of WAL
            one = new_response(tenant)
            output = [assistant_message("done " * 50)]
            await store.record(one, final(one, output), output, events_of(one.id))
        assert group.checkpoints >= 5
        # started over after each checkpoint, the WAL holds at most the commits since the
        # last one: 384 commits without a restart made it 18.8 MB
        assert path.with_name("ors.db-wal").stat().st_size < 6_000_000
        assert await store.get(tenant, one.id) is not None
        with sqlite3.connect(path) as connection:
            connection.execute(SQLITE_PRAGMAS[-1])  # the setting every connection of the store gets
            assert connection.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    finally:
        await store.close()
