"""The response store on SQLAlchemy Core: SQLite (aiosqlite) or PostgreSQL (asyncpg).

Transactions. Every write is one transaction (see :mod:`app.store.engines` for how each
engine begins it), and runs shielded from the caller's cancellation: once started it
commits or rolls back as a whole, even if the request that asked for it goes away, so
a response is never left half-written nor forgotten in ``in_progress`` because its
client disconnected at the wrong moment. Reads of several statements see one snapshot.

Concurrency. On PostgreSQL, ``begin`` takes a share lock on the response it continues
and ``delete`` takes an update lock on the root of the chain before it decides which
items are still needed; so a continuation can never commit on top of items a
concurrent delete removes, and deletes in one chain are serialized. On SQLite every
write runs on the store's one writer thread (:mod:`app.store.sqlite_writer`).

What runs in each transaction: the writes of a response's life in
:mod:`app.store.statements`, deletes in :mod:`app.store.deletion` (which says what a
delete keeps), reads in :mod:`app.store.reads`.

Cancels. :meth:`SqlResponseStore.cancel` marks the row ``cancelled`` and, on PostgreSQL,
sends ``pg_notify`` in the same transaction; see :mod:`app.store.cancels` for how the
notice reaches the replica that runs the response.

Recovery. See :mod:`app.store.liveness` for how a dead owner is told from a live one.
Rows of dead owners left ``queued``/``in_progress`` become ``failed``; their
``resource`` keeps every field, with ``status: "failed"`` and ``error: {code:
"server_restarted", message}``. Recovery runs at :meth:`open`, and on PostgreSQL again
every ``recover_interval`` seconds until :meth:`close`.

An outage. The first read or write that finds the database out of reach says so to the
periodic task, which then takes the instance lock again as soon as it can (see
:mod:`app.store.upkeep`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import StoreUnavailable
from app.protocol.states import ResponseStatus
from app.store import deletion, reads, statements
from app.store.base import (
    JSON,
    ChainLink,
    ConversationTurn,
    Document,
    ItemPage,
    NewResponse,
    Order,
    ResponseStore,
    StoredResponse,
)
from app.store.cancels import CancelNotices, LocalCancelNotices, PostgresCancelNotices
from app.store.codec import packer, unpack_events
from app.store.conversations import SqlConversations, with_turn
from app.store.database import Database, PostgresDatabase, SqliteDatabase
from app.store.engines import create_engine, is_sqlite, normalize_url, sqlite_path, unreachable
from app.store.group_commit import GroupCommit, Writes
from app.store.late_ends import LateEnds
from app.store.liveness import AdvisoryLockLiveness, Liveness, SingleProcessLiveness
from app.store.migrate import upgrade
from app.store.relay import PostgresEventRelay, RelayedEvent, Source
from app.store.schema import NON_TERMINAL, now_ms
from app.store.sqlite_writer import SqliteWriter
from app.store.upkeep import keep_up

log = logging.getLogger("ors.store")

POSTGRES_WRITERS = 4
"""Concurrent group-commit transactions on PostgreSQL (SQLite has one writer anyway)."""

T = TypeVar("T")


class SqlResponseStore(ResponseStore):
    """The durable store. ``url`` is a SQLAlchemy URL (``sqlite+aiosqlite:///path/ors.db``
    or ``postgresql+asyncpg://user@host/db``; plain ``sqlite:`` / ``postgresql:`` are
    accepted); ``instance_id`` names this server process and must be unique per start;
    ``positional_tenants`` is handed to the migrations (see :mod:`app.store.migrate`)."""

    def __init__(
        self, url: str, instance_id: str, *, recover_interval: float = 30.0, pool_size: int = 10,
        positional_tenants: Mapping[str, str] | None = None,
    ) -> None:
        if not instance_id:
            raise ValueError("instance_id must not be empty")
        self.url = normalize_url(url)
        self.instance_id = instance_id
        self.recover_interval = recover_interval
        self._pool_size = pool_size
        self._positional_tenants = positional_tenants
        self._engine: AsyncEngine | None = None
        self._db: Database | None = None
        self._liveness: Liveness | None = None
        self._notices: CancelNotices | None = None
        self._relay: PostgresEventRelay | None = None
        self._recovery_task: asyncio.Task[None] | None = None
        self._recover_lock = asyncio.Lock()
        self._reconnect = asyncio.Event()
        """Set when a read or write found the database out of reach (:mod:`app.store.upkeep`)."""
        self._group: Writes | None = None
        self._late_ends = LateEnds(functools.partial(self._write, single=True))

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError("the store is not open")
        return self._engine

    @property
    def statement_engine(self) -> Engine:
        """The synchronous engine whose events see every statement of reads and writes
        (SQLite: the one its reader and writer threads use), except PostgreSQL's writes
        made with ``flush=False`` (a response's start), which run on a pool of their own
        (:func:`app.store.engines.create_unflushed_engine`)."""
        if self._db is None:
            raise RuntimeError("the store is not open")
        return self._db.sync_engine

    @property
    def conversations(self) -> SqlConversations:
        return SqlConversations(self._write, self._read)

    @property
    def is_sqlite(self) -> bool:
        return is_sqlite(self.url)

    # -- lifecycle -----------------------------------------------------------------

    async def open(self) -> None:
        """Lock (SQLite: the file; PostgreSQL: the instance id), migrate to head,
        recover, and on PostgreSQL start periodic recovery."""
        if self._engine is not None:
            raise RuntimeError("the store is already open")
        engine = create_engine(self.url, pool_size=self._pool_size)
        self._engine = engine
        if self.is_sqlite:
            sqlite = SqliteDatabase(self.url)
            self._db, self._group = sqlite, SqliteWriter(sqlite)
        else:
            postgres = PostgresDatabase(engine, writers=POSTGRES_WRITERS)
            self._db, self._group = postgres, GroupCommit(postgres, writers=POSTGRES_WRITERS)
        try:
            if self.is_sqlite:
                self._liveness = SingleProcessLiveness(sqlite_path(self.url))
                await self._liveness.start()
                await upgrade(engine, self._positional_tenants)
                self._notices = LocalCancelNotices()
            else:
                await upgrade(engine, self._positional_tenants)
                self._liveness = AdvisoryLockLiveness(engine, self.instance_id)
                await self._liveness.start()
                dsn = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
                self._notices = PostgresCancelNotices(dsn, self._missed_cancels)
                self._relay = PostgresEventRelay(dsn)
            await self.recover()
            if self._liveness.periodic and self.recover_interval > 0:
                self._recovery_task = asyncio.create_task(keep_up(self.check, self.recover_interval, self._reconnect),
                                                          name="store-upkeep")
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop periodic recovery, let writes in flight commit, release the locks and the
        pool. Idempotent."""
        task, self._recovery_task = self._recovery_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._late_ends.close()
        group, self._group = self._group, None
        if group is not None:
            await group.close()
        relay, self._relay = self._relay, None
        if relay is not None:
            await relay.close()
        notices, self._notices = self._notices, None
        if notices is not None:
            await notices.close()
        liveness, self._liveness = self._liveness, None
        engine, self._engine = self._engine, None
        database, self._db = self._db, None
        try:
            if liveness is not None:
                await liveness.close()
        finally:
            if database is not None:
                await database.close()
            if engine is not None:
                await engine.dispose()

    async def check(self) -> None:
        """One pass of the periodic task: the lock and the notices checked (and taken
        again if their connection broke), then recovery, except in a pass that had to
        take this instance's lock again. An outage takes every replica's lock with its
        connection; until each has taken its own again, its lock would say it is dead.
        So a replica back from an outage does not judge the others at once: they take
        theirs back within about a second of finding the database out of reach, or at
        their next pass (within ``recover_interval``), and this one recovers at its next."""
        async with self._recover_lock:
            relocked = await self._liveness.heartbeat() if self._liveness is not None else False
        if self._notices is not None:
            await self._notices.heartbeat()
        if self._relay is not None:
            await self._relay.heartbeat()
        if not relocked:
            await self.recover()

    # -- writes --------------------------------------------------------------------

    async def begin(self, response: NewResponse) -> None:
        # visible at once, on disk with the response's end at the latest (group_commit)
        work = functools.partial(statements.write_begin, *statements.begin_rows(response, self.instance_id))
        await self._write(work, flush=False, single=True)

    async def finish(
        self, tenant: str, response_id: str, resource: Document, output_items: list[JSON], events: list[str] | None,
        turn: ConversationTurn | None = None,
    ) -> bool:
        """Writes nothing (``False``) if the response was cancelled or deleted meanwhile
        (the cancel or the delete wins; the output of the run is dropped)."""
        work = await self._finish_work(tenant, response_id, resource, output_items, events)
        return await self._write(with_turn(work, turn), single=turn is None)

    async def finish_later(
        self, tenant: str, response_id: str, resource: Document, output_items: list[JSON], events: list[str] | None
    ) -> None:
        self._late_ends.add(response_id, await self._finish_work(tenant, response_id, resource, output_items, events))

    async def _finish_work(
        self, tenant: str, response_id: str, resource: Document, output_items: list[JSON], events: list[str] | None
    ) -> Callable[[Connection], bool]:
        status = statements.terminal_status(resource)
        output_rows = statements.rows_of_items(response_id, "output", output_items)
        return functools.partial(statements.write_finish, tenant, response_id, status, resource, output_rows,
                                 await self._packer(events))

    async def record(
        self, response: NewResponse, resource: Document, output_items: list[JSON], events: list[str] | None,
        turn: ConversationTurn | None = None,
    ) -> bool:
        # Nobody else can know the id yet (see the base class): no row to lock or update,
        # the row goes in already finished, with its items (and events, if kept).
        status = statements.terminal_status(resource)
        now = now_ms()
        row, item_rows = statements.begin_rows(
            response, self.instance_id, final={"status": status, "resource": resource, "finished_at": now,
                                               "updated_at": now}, output_items=output_items)
        work = functools.partial(statements.write_record, row, item_rows, await self._packer(events))
        return await self._write(with_turn(work, turn), single=turn is None)

    async def set_status(self, tenant: str, response_id: str, status: str, resource: Document) -> None:
        if status not in NON_TERMINAL and status != ResponseStatus.CANCELLED:
            raise ValueError(f"set_status moves to queued, in_progress or cancelled, not {status!r}")

        # a step between starts (queued -> in_progress) is flushed with the end; a cancel
        # is an end
        await self._write(functools.partial(statements.write_status, tenant, response_id, status, resource),
                          flush=status == ResponseStatus.CANCELLED)

    async def cancel(self, tenant: str, response_id: str) -> StoredResponse | None:
        stored, cancelled = await self._write(functools.partial(statements.write_cancel, tenant, response_id,
                                                                 notify=not self.is_sqlite))
        if cancelled and self._notices is not None:
            self._notices.recorded(tenant, response_id)
        return stored

    async def serve_follows(self, source: Source) -> None:
        if self._relay is not None:
            await self._relay.start(source)

    def follow_elsewhere(self, tenant: str, response_id: str, after: int | None) -> AsyncIterator[RelayedEvent] | None:
        if self._relay is None:
            return None
        return self._relay.follow(tenant, response_id, after, self._ended_events)

    async def _ended_events(self, tenant: str, response_id: str) -> list[str] | None:
        """A followed response's stored events once it has ended (none if it has gone or
        ended without events); ``None`` while it still runs."""
        stored = await self.get(tenant, response_id)
        if stored is None:
            return []
        if stored.status in NON_TERMINAL:
            return None
        return await self.events(tenant, response_id) or []

    async def watch_cancels(self, callback: Callable[[str, str], object]) -> None:
        if self._notices is None:
            raise RuntimeError("the store is not open")
        await self._notices.watch(callback)

    async def _missed_cancels(self, since_ms: int) -> list[tuple[str, str]]:
        """This instance's responses cancelled since ``since_ms`` (a lost listener's replay)."""
        return await self._read(functools.partial(reads.cancelled_since, self.instance_id, since_ms))

    async def delete(self, tenant: str, response_id: str) -> bool:
        return await self._write(functools.partial(deletion.write_delete, tenant, response_id,
                                                   lock_root=not self.is_sqlite))

    async def expire(self, created_before: int, limit: int) -> tuple[int, int]:
        # found by a reader (a scan that holds no write lock), deleted by one write
        rows = await self._read(functools.partial(deletion.expired, created_before, limit))
        if not rows:
            return 0, 0
        deleted = await self._write(functools.partial(deletion.delete_many, rows, lock_root=not self.is_sqlite))
        return len(rows), deleted

    async def recover(self) -> int:
        async with self._recover_lock:
            liveness = self._liveness
            if liveness is None:
                raise RuntimeError("the store is not open")
            owners = await self._read(functools.partial(reads.unfinished_owners, self.instance_id))
            recovered = 0
            for owner in owners:
                async with liveness.claim_if_dead(owner) as dead:
                    if dead:
                        recovered += await self._write(functools.partial(statements.fail_rows_of, owner=owner))
            if recovered:
                log.warning("Marked %d response(s) left unfinished by a stopped server as failed.", recovered)
            return recovered

    async def _packer(self, events: list[str] | None) -> Callable[[], bytes] | None:
        """The body of ``events``, packed by the write itself where writes run beside
        the event loop (:func:`app.store.codec.packer`); ``None`` when none are kept."""
        if self._group is None:
            raise RuntimeError("the store is not open")
        if events is None:
            return None
        return await packer(events, beside_loop=self._group.beside_loop)

    async def _write(self, work: Callable[[Connection], T], *, flush: bool = True, single: bool = False) -> T:
        """Run ``work`` in a write transaction, grouped with concurrent writes (see
        :mod:`app.store.group_commit`, also for ``flush`` and ``single``: a write that is
        one statement on PostgreSQL); the caller's cancellation does not interrupt it."""
        if self._group is None:
            raise RuntimeError("the store is not open")
        try:
            return await self._group.run(work, flush=flush, single=single)
        except Exception as error:
            if unreachable(error):
                self._reconnect.set()
                raise _unavailable(error) from error
            raise

    # -- reads ---------------------------------------------------------------------

    async def _read(self, work: Callable[[Connection], T], *, single: bool = False) -> T:
        """Run ``work`` in one read transaction (one snapshot); ``single``: it is one
        statement (see :meth:`app.store.database.Database.read`)."""
        if self._db is None:
            raise RuntimeError("the store is not open")
        try:
            return await self._db.read(work, single=single)
        except Exception as error:
            if unreachable(error):
                self._reconnect.set()
                raise _unavailable(error) from error
            raise

    async def ping(self) -> None:
        await self._read(lambda connection: connection.execute(select(1)).scalar_one(), single=True)

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        return await self._read(functools.partial(reads.get_response, tenant, response_id), single=True)

    async def chain(self, tenant: str, response_id: str) -> list[ChainLink] | None:
        """One statement whatever the depth (:data:`app.store.reads.CHAIN`): the links,
        up ``previous_response_id``, and all their items, in one snapshot; on PostgreSQL
        one round trip."""
        return await self._read(functools.partial(reads.chain_links, tenant, response_id), single=True)

    async def input_items(
        self, tenant: str, response_id: str, *, limit: int, order: Order, after: str | None
    ) -> ItemPage | None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if order not in ("asc", "desc"):
            raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
        return await self._read(functools.partial(reads.input_items_page, tenant, response_id, limit, order, after))

    async def responses(self, tenant: str, *, limit: int, order: Order, after: str | None) -> ItemPage:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        return await self._read(functools.partial(reads.responses_page, tenant, limit, order, after))

    async def events(self, tenant: str, response_id: str) -> list[str] | None:
        body = await self._read(functools.partial(reads.events_body, tenant, response_id), single=True)
        return None if body is None else await unpack_events(body)


def _unavailable(error: Exception) -> StoreUnavailable:
    """What a read or write that could not reach the database raises instead (503, a
    retry may succeed); the cause is logged once here."""
    log.warning("the response store cannot be reached: %r", error)
    return StoreUnavailable("The response store cannot be reached at the moment; retry shortly.")
