"""SQLite's writer thread: one thread runs every write, concurrent writes share a commit,
a failing write fails alone, reads go on while a write runs, closing lets every write
handed over commit, and a write after close, or after the thread ended, fails at once."""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Connection

from app.errors import ServerError
from app.store.engines import sqlite_url
from app.store.schema import responses
from app.store.sql import SqlResponseStore
from app.store.sqlite_writer import SqliteWriter, WriterStopped
from tests.store.helpers import new_response

pytestmark = pytest.mark.anyio

WAIT_SECONDS = 30.0
"""How long a held write waits for the test to release it, at most (a deadline for a
test that failed, never reached otherwise)."""


@pytest.fixture()
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqlResponseStore]:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), secrets.token_hex(8))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def _writer(store: SqlResponseStore) -> SqliteWriter:
    assert isinstance(store._group, SqliteWriter)
    return store._group


class _Hold:
    """A write that keeps the writer thread busy until released, so that the writes made
    meanwhile wait in its queue and form the next batch."""

    def __init__(self) -> None:
        self.taken = threading.Event()
        self.released = threading.Event()

    def __call__(self, connection: Connection) -> str:
        self.taken.set()
        if not self.released.wait(WAIT_SECONDS):
            raise AssertionError("never released")
        return "held"

    async def until_taken(self) -> None:
        assert await asyncio.to_thread(self.taken.wait, WAIT_SECONDS), "the writer never took the held write"


def _stored_ids(connection: Connection) -> set[str]:
    return set(connection.scalars(select(responses.c.id)))


async def test_every_write_runs_on_one_thread_beside_the_loop(sqlite_store: SqlResponseStore) -> None:
    writer = _writer(sqlite_store)

    def thread_of(connection: Connection) -> int:  # a local function: nothing is pickled
        return threading.get_ident()

    seen = set(await asyncio.gather(*(writer.run(thread_of) for _ in range(20))))
    seen.add(await writer.run(thread_of))
    assert len(seen) == 1 and threading.get_ident() not in seen


async def test_concurrent_writes_share_one_commit(sqlite_store: SqlResponseStore, tenant: str) -> None:
    writer = _writer(sqlite_store)
    hold = _Hold()
    held = asyncio.ensure_future(writer.run(hold))
    await hold.until_taken()
    before = writer.batches
    begun = [new_response(tenant) for _ in range(20)]
    writes = asyncio.gather(*(sqlite_store.begin(one) for one in begun))
    await asyncio.sleep(0)  # every one handed over while the writer is held
    hold.released.set()
    assert await held == "held"
    assert await writes == [None] * 20
    assert writer.batches - before == 2  # the held write's transaction, then the twenty in one
    for one in begun:
        assert await sqlite_store.get(tenant, one.id) is not None


async def test_a_failing_write_among_several_fails_alone(sqlite_store: SqlResponseStore, tenant: str) -> None:
    writer = _writer(sqlite_store)
    before, failing, after = new_response(tenant), new_response(tenant), new_response(tenant)
    await sqlite_store.begin(failing)  # taken: beginning it again conflicts

    def half_then_raise(connection: Connection) -> None:
        connection.exec_driver_sql("UPDATE responses SET model = 'changed' WHERE id = ?", (failing.id,))
        raise ValueError("this write fails")

    hold = _Hold()
    held = asyncio.ensure_future(writer.run(hold))
    await hold.until_taken()
    outcomes = asyncio.gather(sqlite_store.begin(before), writer.run(half_then_raise), sqlite_store.begin(failing),
                              sqlite_store.begin(after), return_exceptions=True)
    await asyncio.sleep(0)
    hold.released.set()
    await held
    first, raised, conflict, last = await outcomes
    assert first is None and last is None
    assert isinstance(raised, ValueError) and str(raised) == "this write fails"
    assert isinstance(conflict, ServerError)  # StoreConflict
    stored = await sqlite_store.get(tenant, failing.id)
    assert stored is not None and stored.model == failing.model  # the failing write's change rolled back
    assert {before.id, after.id} <= await writer.run(_stored_ids)


async def test_reads_go_on_while_a_write_runs(sqlite_store: SqlResponseStore, tenant: str) -> None:
    one = new_response(tenant)
    await sqlite_store.begin(one)
    writer = _writer(sqlite_store)
    hold = _Hold()
    held = asyncio.ensure_future(writer.run(hold))
    await hold.until_taken()
    try:
        stored = await sqlite_store.get(tenant, one.id)  # the loop and the readers are free
        assert stored is not None and stored.status == "in_progress"
        assert not held.done()
    finally:
        hold.released.set()
    assert await held == "held"


async def test_close_lets_every_write_handed_over_commit(tmp_path: Path, tenant: str) -> None:
    url = sqlite_url(tmp_path / "ors.db")
    store = SqlResponseStore(url, secrets.token_hex(8))
    await store.open()
    writer = _writer(store)
    hold = _Hold()
    held = asyncio.ensure_future(writer.run(hold))
    await hold.until_taken()
    begun = [new_response(tenant) for _ in range(50)]
    writes = [asyncio.ensure_future(store.begin(one)) for one in begun]
    await asyncio.sleep(0)  # every one handed over
    closing = asyncio.ensure_future(store.close())
    await asyncio.sleep(0)
    hold.released.set()
    await closing
    assert await held == "held"
    assert [write.result() for write in writes] == [None] * 50
    assert not writer._thread.is_alive()
    again = SqlResponseStore(url, secrets.token_hex(8))
    await again.open()
    try:
        for one in begun:
            assert await again.get(tenant, one.id) is not None
    finally:
        await again.close()


async def test_a_write_after_close_fails_at_once(tmp_path: Path, tenant: str) -> None:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), secrets.token_hex(8))
    await store.open()
    writer = _writer(store)
    await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        await writer.run(_stored_ids)
    with pytest.raises(RuntimeError, match="not open"):
        await store.begin(new_response(tenant))
    await writer.close()  # again: nothing to do


async def test_a_writer_thread_that_ends_fails_what_waited_and_every_later_write(
    sqlite_store: SqlResponseStore, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a path the store's own writes can take (they raise ``Exception``s, which fail
    alone): a write that ends the thread itself stands for a bug."""
    writer = _writer(sqlite_store)

    def end_the_thread(connection: Connection) -> None:
        raise SystemExit

    hold = _Hold()
    held = asyncio.ensure_future(writer.run(hold))
    await hold.until_taken()
    ending = asyncio.ensure_future(writer.run(end_the_thread))
    behind = asyncio.ensure_future(sqlite_store.begin(new_response(tenant)))  # in the same batch
    await asyncio.sleep(0)
    hold.released.set()
    await held
    for waited in (ending, behind):
        with pytest.raises(WriterStopped):
            await waited
    with pytest.raises(WriterStopped):
        await sqlite_store.begin(new_response(tenant))
    assert "stopped unexpectedly" in caplog.text
