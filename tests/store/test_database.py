"""What the store sends PostgreSQL for each write and read (``app.store.database``): alone,
a write of one statement, a read by id and a chain are one round trip each, with no ``BEGIN``,
``SET`` or ``COMMIT``; a response's start goes on a session that does not wait for its
WAL flush, its end on one that does; writes that come together still share one
transaction. On the real PostgreSQL server; what is sent is recorded by SQLAlchemy's
``after_cursor_execute`` event (statements) and where asyncpg sends its own queries
(``BEGIN``, ``COMMIT``)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from app.store.sql import SqlResponseStore
from tests.store.helpers import assistant_message, events_of, final, new_response, on_every_engine

pytestmark = pytest.mark.anyio


@contextlib.contextmanager
def _log_sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Each statement and each of asyncpg's own queries while inside, in order, with the
    session's ``synchronous_commit`` for statements (read after each on a cursor of the
    same connection, and not recorded)."""
    sent: list[tuple[str, str]] = []

    def statement(connection: Any, cursor: Any, operation: str, *rest: Any) -> None:
        probe = connection.connection.cursor()
        try:
            probe.execute("SHOW synchronous_commit")
            (setting,) = probe.fetchone()
        finally:
            probe.close()
        sent.append((operation, setting))

    query = asyncpg.Connection.execute

    async def logged_query(self: Any, text: str, *args: Any, **kwargs: Any) -> Any:
        sent.append((text, ""))
        return await query(self, text, *args, **kwargs)

    monkeypatch.setattr(asyncpg.Connection, "execute", logged_query)
    try:
        with on_every_engine("after_cursor_execute", statement):
            yield sent
    finally:
        monkeypatch.undo()


async def test_alone_each_write_and_each_read_is_one_round_trip(
    postgres_database_url: str, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqlResponseStore(postgres_database_url, secrets.token_hex(8))
    await store.open()
    try:
        output = [assistant_message("done")]
        warm = new_response(tenant)  # every pool holds a connection, every statement is prepared
        await store.begin(warm)
        await store.finish(tenant, warm.id, final(warm, output), output, events_of(warm.id))
        await store.get(tenant, warm.id)
        with _log_sent(monkeypatch) as sent:
            begun = new_response(tenant)
            await store.begin(begun)
            ((start, setting),) = sent
            assert "INSERT INTO responses" in start and setting == "off"

            sent.clear()
            assert await store.finish(tenant, begun.id, final(begun, output), output, events_of(begun.id))
            ((end, setting),) = sent
            assert "UPDATE responses" in end and setting == "on"  # durable before it is answered

            sent.clear()
            whole = new_response(tenant, previous=begun.id)
            assert await store.record(whole, final(whole, output), output, events_of(whole.id))
            ((record, setting),) = sent
            assert "FOR SHARE" in record and setting == "on"

            sent.clear()
            stored = await store.get(tenant, begun.id)
            assert stored is not None and stored.status == "completed"
            assert await store.events(tenant, begun.id) == events_of(begun.id)
            assert [sql.split()[0] for sql, _ in sent] == ["SELECT", "SELECT"]

            sent.clear()
            links = await store.chain(tenant, whole.id)  # a continuation's context: links and items at once
            assert links is not None and [link.response_id for link in links] == [begun.id, whole.id]
            assert links[0].output_items == output and links[1].input_items == whole.input_items
            ((chain, _),) = sent
            assert chain.startswith("WITH RECURSIVE")

            sent.clear()
            # a cancel is not one statement: it keeps its transaction
            running = new_response(tenant, background=True)
            await store.begin(running)
            sent.clear()
            assert await store.cancel(tenant, running.id) is not None
            assert sent[0][0].startswith("BEGIN") and sent[-1][0].startswith("COMMIT")
    finally:
        await store.close()


async def test_writes_that_come_together_share_one_transaction(
    postgres_database_url: str, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqlResponseStore(postgres_database_url, secrets.token_hex(8))
    await store.open()
    try:
        await store.begin(new_response(tenant))
        with _log_sent(monkeypatch) as sent:
            first, second = new_response(tenant), new_response(tenant)
            # queued in one turn of the loop: one writer takes both
            await asyncio.gather(store.begin(first), store.begin(second))
            texts = [sql for sql, _ in sent]
            assert texts[0].startswith("BEGIN") and texts[-1].startswith("COMMIT"), texts
            inserts = [setting for sql, setting in sent if "INSERT INTO responses" in sql]
            assert inserts == ["off", "off"]
            assert not any(sql.startswith("SET") for sql in texts)  # the session's setting, not one per transaction
            for response in (first, second):
                stored = await store.get(tenant, response.id)
                assert stored is not None and stored.status == response.status
    finally:
        await store.close()
