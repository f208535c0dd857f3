"""The response store on SQLAlchemy Core: SQLite (aiosqlite) or PostgreSQL (asyncpg).

Transactions. Every write is one transaction (see :mod:`app.store.engines` for how each
engine begins it), and runs shielded from the caller's cancellation: once started it
commits or rolls back as a whole, even if the request that asked for it goes away, so
a response is never left half-written nor forgotten in ``in_progress`` because its
client disconnected at the wrong moment. Reads of several statements see one snapshot.

Concurrency. On PostgreSQL, ``begin`` takes a share lock on the response it continues
and ``delete`` takes an update lock on the root of the chain before it decides which
items are still needed; so a continuation can never commit on top of items a
concurrent delete removes, and deletes in one chain are serialized. On SQLite writers
are serialized by the database.

Deletion. A deleted response stays as a hidden row (tombstone); its events are removed
at once (nothing can read them any more). Its items are removed as soon as no visible
response descending from it needs them: deleting a response walks up through its
deleted ancestors and removes the items of every one that has no visible descendant
left. So deleting the last turn of a conversation frees its items at once; deleting a
middle turn keeps its items until the turns after it are deleted too.

Cancels. :meth:`SqlResponseStore.cancel` marks the row ``cancelled`` and, on PostgreSQL,
sends ``pg_notify`` in the same transaction; see :mod:`app.store.cancels` for how the
notice reaches the replica that runs the response.

Recovery. See :mod:`app.store.liveness` for how a dead owner is told from a live one.
Rows of dead owners left ``queued``/``in_progress`` become ``failed``; their
``resource`` keeps every field, with ``status: "failed"`` and ``error: {code:
"server_restarted", message}``. Recovery runs at :meth:`open`, and on PostgreSQL again
every ``recover_interval`` seconds until :meth:`close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import CTE, Row, bindparam, delete, func, insert, literal_column, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from app.errors import PreviousResponseNotFound
from app.store.base import (
    JSON,
    ChainLink,
    Document,
    ItemPage,
    NewResponse,
    Order,
    ResponseStore,
    StoreConflict,
    StoredResponse,
)
from app.store.relay import PostgresEventRelay, RelayedEvent, Source
from app.store.cancels import (
    CHANNEL,
    CancelNotices,
    LocalCancelNotices,
    PostgresCancelNotices,
    encode_notice,
)
from app.store.codec import packer, unpack_events
from app.store.direct import Direct
from app.store.group_commit import GroupCommit, Writes
from app.store.sqlite_writer import WriterProcess
from app.store.database import Database, PostgresDatabase, SqliteDatabase
from app.store.engines import create_engine, is_sqlite, normalize_url, sqlite_path
from app.store.liveness import AdvisoryLockLiveness, Liveness, SingleProcessLiveness
from app.store.migrate import upgrade
from app.store.schema import NON_TERMINAL, TERMINAL, Serialized, items, responses
from app.store.schema import events as event_rows

log = logging.getLogger(__name__)

POSTGRES_WRITERS = 4
"""Concurrent group-commit transactions on PostgreSQL (SQLite has one writer anyway)."""

T = TypeVar("T")

RESTARTED_CODE = "server_restarted"
RESTARTED_MESSAGE = "The server stopped before this response finished; it was not completed."
MAX_CHAIN_DEPTH = 1_000_000
"""A guard against a cycle, which the write path cannot create."""
PURGE_BATCH = 500


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
        self._group: Writes | None = None

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError("the store is not open")
        return self._engine

    @property
    def statement_engine(self) -> Engine:
        """The synchronous engine whose events see every statement of reads (SQLite: the
        one its reader threads use) and, on PostgreSQL, of writes (the async engine's).
        SQLite's writes run in the writer process, whose engine is its own."""
        if self._db is None:
            raise RuntimeError("the store is not open")
        return self._db.sync_engine

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
            self._db, self._group = SqliteDatabase(self.url), WriterProcess(self.url)
            await self._group.start()
        else:
            postgres = PostgresDatabase(engine)
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
                self._recovery_task = asyncio.create_task(self._recover_periodically())
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

    async def _recover_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.recover_interval)
            try:
                async with self._recover_lock:
                    if self._liveness is not None:
                        await self._liveness.heartbeat()
                if self._notices is not None:
                    await self._notices.heartbeat()
                await self.recover()
            except Exception:
                log.exception("Periodic recovery of the response store failed; retrying later.")

    # -- writes --------------------------------------------------------------------

    async def begin(self, response: NewResponse) -> None:
        # visible at once, on disk with the response's end at the latest (group_commit)
        await self._write(functools.partial(_begin, *self._begin_rows(response)), flush=False)

    async def finish(
        self, tenant: str, response_id: str, resource: Document, output_items: list[JSON], events: list[str] | None
    ) -> bool:
        """Writes nothing (``False``) if the response was cancelled or deleted meanwhile
        (the cancel or the delete wins; the output of the run is dropped)."""
        status = _status(resource)
        if status not in TERMINAL:
            raise ValueError(f"a finished response has a terminal status, not {status!r}")
        output_rows = _item_rows(response_id, "output", output_items)
        body = await self._packer(events)
        return await self._write(functools.partial(_finish, tenant, response_id, status, resource, output_rows, body))

    async def record(
        self, response: NewResponse, resource: Document, output_items: list[JSON], events: list[str] | None
    ) -> bool:
        # Nobody else can know the id yet (see the base class): no row to lock or update,
        # the row goes in already finished, with its items (and events, if kept): two or
        # three statements.
        status = _status(resource)
        if status not in TERMINAL:
            raise ValueError(f"a finished response has a terminal status, not {status!r}")
        now = _now_ms()
        row, item_rows = self._begin_rows(response, final={"status": status, "resource": resource,
                                                           "finished_at": now, "updated_at": now},
                                          output_items=output_items)
        return await self._write(functools.partial(_record, row, item_rows, await self._packer(events)))

    def _begin_rows(
        self, response: NewResponse, *, final: JSON | None = None, output_items: Sequence[JSON] = ()
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The row and its items' rows; with ``final`` (the terminal columns) and
        ``output_items``, a response recorded whole."""
        if response.status not in NON_TERMINAL:
            raise ValueError(f"a response begins queued or in_progress, not {response.status!r}")
        row = {
            "id": response.id,
            "tenant": response.tenant,
            "status": response.status,
            "created_at": response.created_at,
            "model": response.model,
            "previous_response_id": response.previous_response_id,
            "instructions": _plain_text(response.instructions),
            "tools": response.tools,
            "resource": response.resource,
            "background": response.background,
            "owner": self.instance_id,
            "updated_at": _now_ms(),
        } | (final or {})
        item_rows = _item_rows(response.id, "input", response.input_items)
        item_rows += _item_rows(response.id, "output", output_items)
        return row, item_rows

    async def set_status(self, tenant: str, response_id: str, status: str, resource: Document) -> None:
        if status not in NON_TERMINAL and status != "cancelled":
            raise ValueError(f"set_status moves to queued, in_progress or cancelled, not {status!r}")

        # a step between starts (queued -> in_progress) is flushed with the end; a cancel
        # is an end
        await self._write(functools.partial(_set_status, tenant, response_id, status, resource),
                          flush=status == "cancelled")

    async def cancel(self, tenant: str, response_id: str) -> StoredResponse | None:
        stored, cancelled = await self._write(functools.partial(_cancel, tenant, response_id,
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
        if stored.status in ("queued", "in_progress"):
            return None
        return await self.events(tenant, response_id) or []

    async def watch_cancels(self, callback: Callable[[str, str], object]) -> None:
        if self._notices is None:
            raise RuntimeError("the store is not open")
        await self._notices.watch(callback)

    async def _missed_cancels(self, since_ms: int) -> list[tuple[str, str]]:
        """This instance's responses cancelled since ``since_ms`` (a lost listener's replay)."""
        query = select(responses.c.tenant, responses.c.id).where(
            responses.c.owner == self.instance_id,
            responses.c.status == "cancelled",
            responses.c.updated_at >= since_ms,
        )
        rows = await self._read(lambda connection: connection.execute(query).all())
        return [(row.tenant, row.id) for row in rows]

    async def delete(self, tenant: str, response_id: str) -> bool:
        return await self._write(functools.partial(_delete, tenant, response_id, lock_root=not self.is_sqlite))

    async def recover(self) -> int:
        async with self._recover_lock:
            liveness = self._liveness
            if liveness is None:
                raise RuntimeError("the store is not open")
            query = (
                select(responses.c.owner)
                .where(responses.c.finished_at.is_(None), responses.c.owner != self.instance_id)
                .distinct()
            )
            owners = await self._read(lambda connection: connection.scalars(query).all())
            recovered = 0
            for owner in owners:
                async with liveness.claim_if_dead(owner) as dead:
                    if dead:
                        recovered += await self._write(functools.partial(_fail_rows_of, owner=owner))
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

    async def _write(self, work: Callable[[Connection], T], *, flush: bool = True) -> T:
        """Run ``work`` in a write transaction, grouped with concurrent writes (see
        :mod:`app.store.group_commit`, also for ``flush``); the caller's cancellation
        does not interrupt it."""
        if self._group is None:
            raise RuntimeError("the store is not open")
        return await self._group.run(work, flush=flush)

    # -- reads ---------------------------------------------------------------------

    async def _read(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one read transaction (one snapshot)."""
        if self._db is None:
            raise RuntimeError("the store is not open")
        return await self._db.read(work)

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        params = {"b_tenant": tenant, "b_id": response_id}
        row = await self._read(lambda connection: connection.execute(_GET, params).first())
        return None if row is None else _stored(row)

    async def chain(self, tenant: str, response_id: str) -> list[ChainLink] | None:
        """Two statements whatever the depth: the links (a recursive CTE up
        ``previous_response_id``), then all their items (the same CTE joined to
        ``items``), in one snapshot."""
        ancestry = _ancestry_cte(tenant, response_id, visible_start=True)
        links_query = (
            select(ancestry.c.id, responses.c.tools)
            .join(responses, responses.c.id == ancestry.c.id)
            .order_by(ancestry.c.depth.desc())
        )
        items_query = (
            select(items.c.response_id, items.c.role, items.c.item)
            .where(items.c.response_id.in_(select(ancestry.c.id)))
            .order_by(items.c.response_id, items.c.role, items.c.position)
        )

        def work(connection: Connection) -> tuple[Sequence[Row[Any]], Sequence[Row[Any]]]:
            links = connection.execute(links_query).all()
            return (links, connection.execute(items_query).all()) if links else (links, [])

        links, rows = await self._read(work)
        if not links:
            return None
        own: dict[str, tuple[list[JSON], list[JSON]]] = {link.id: ([], []) for link in links}
        for row in rows:
            inputs, outputs = own[row.response_id]
            (inputs if row.role == "input" else outputs).append(row.item)
        return [
            ChainLink(
                response_id=link.id, tools=link.tools, input_items=own[link.id][0], output_items=own[link.id][1]
            )
            for link in links
        ]

    async def input_items(
        self, tenant: str, response_id: str, *, limit: int, order: Order, after: str | None
    ) -> ItemPage | None:
        """Items after the cursor in the chosen order (``desc`` walks the original order
        backwards); an ``after`` id that is not one of the response's input items gives
        an empty page."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if order not in ("asc", "desc"):
            raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
        ascending = order == "asc"
        own_inputs = (items.c.response_id == response_id) & (items.c.role == "input")
        query = select(items.c.item).where(own_inputs)
        if after is not None:
            cursor = (
                select(func.min(items.c.position)).where(own_inputs, items.c.item_id == after).scalar_subquery()
            )
            query = query.where(items.c.position > cursor if ascending else items.c.position < cursor)
        query = query.order_by(items.c.position.asc() if ascending else items.c.position.desc()).limit(limit + 1)
        visible = select(responses.c.id).where(_visible(tenant, response_id))

        def work(connection: Connection) -> Sequence[Any] | None:
            if connection.scalar(visible) is None:
                return None
            return connection.scalars(query).all()

        page = await self._read(work)
        if page is None:
            return None
        return ItemPage(data=list(page[:limit]), has_more=len(page) > limit)

    async def events(self, tenant: str, response_id: str) -> list[str] | None:
        params = {"b_tenant": tenant, "b_id": response_id}
        body = await self._read(lambda connection: connection.scalar(_EVENTS, params))
        return None if body is None else await unpack_events(body)


# -- statements ------------------------------------------------------------------------

_INSERT_RESPONSE = Direct(insert(responses))
_INSERT_ITEM = Direct(insert(items))
_INSERT_EVENTS = Direct(insert(event_rows))
"""Built once, and run on SQLite by the driver itself (:mod:`app.store.direct`), as are
``_LOCK`` and ``_FINISH`` below."""


def _status(resource: Document) -> Any:
    return resource.status if isinstance(resource, Serialized) else resource.get("status")


# -- writes: functions of a connection and plain values, so that SQLite's writer process
# can be sent them (app.store.sqlite_writer)


def _begin(row: dict[str, Any], item_rows: list[dict[str, Any]], connection: Connection) -> None:
    """A response's row and its items."""
    previous = row["previous_response_id"]
    if previous is not None:
        visible = select(responses.c.id).where(_visible(row["tenant"], previous))
        if connection.scalar(visible.with_for_update(read=True)) is None:
            raise PreviousResponseNotFound(
                f"Previous response with id '{previous}' not found.", param="previous_response_id"
            )
    try:
        _INSERT_RESPONSE.execute(connection, row)
    except IntegrityError as error:
        raise StoreConflict(f"Response '{row['id']}' already exists.") from error
    if item_rows:
        _INSERT_ITEM.execute(connection, item_rows)


def _record(row: dict[str, Any], item_rows: list[dict[str, Any]], body: Callable[[], bytes] | None,
            connection: Connection) -> bool:
    """A response recorded whole: its row (already finished), its items and its events
    (none kept: ``body`` is ``None``)."""
    _begin(row, item_rows, connection)
    if body is not None:
        _INSERT_EVENTS.execute(connection, {"response_id": row["id"], "body": body()})
    return True


def _finish(tenant: str, response_id: str, status: str, resource: Document, output_rows: list[dict[str, Any]],
            body: Callable[[], bytes] | None, connection: Connection) -> bool:
    now = _now_ms()
    # the row is locked and finished in one statement, if it is still running; only
    # otherwise is it read, to say why (one statement fewer on the usual path)
    if not _FINISH.execute(connection, {"b_id": response_id, "b_tenant": tenant, "status": status,
                                        "resource": resource, "updated_at": now, "finished_at": now}):
        current = _lock_for_update(connection, tenant, response_id)
        if current.deleted_at is not None or current.status == "cancelled":
            return False
        raise StoreConflict(f"Response '{response_id}' has already finished ({current.status}).")
    if output_rows:
        _INSERT_ITEM.execute(connection, output_rows)
    if body is not None:
        _INSERT_EVENTS.execute(connection, {"response_id": response_id, "body": body()})
    return True


def _set_status(tenant: str, response_id: str, status: str, resource: Document, connection: Connection) -> None:
    current = _lock_for_update(connection, tenant, response_id)
    if current.deleted_at is not None or current.status == "cancelled":
        return
    if current.finished_at is not None:
        raise StoreConflict(f"Response '{response_id}' has already finished ({current.status}).")
    now = _now_ms()
    values: dict[str, Any] = {"status": status, "resource": resource, "updated_at": now}
    if status == "cancelled":
        values["finished_at"] = now
    connection.execute(update(responses).where(responses.c.id == response_id).values(values))


def _cancel(tenant: str, response_id: str, connection: Connection, *,
            notify: bool) -> tuple[StoredResponse | None, bool]:
    """``notify``: send ``pg_notify`` at commit, and only if the cancel commits (PostgreSQL)."""
    row = (
        connection.execute(select(*_STORED_COLUMNS).where(_visible(tenant, response_id)).with_for_update())
    ).first()
    if row is None:
        return None, False
    if row.status in TERMINAL:
        return _stored(row), False
    resource = cancelled_resource(row.resource)
    now = _now_ms()
    connection.execute(
        update(responses)
        .where(responses.c.id == response_id)
        .values(status="cancelled", resource=resource, updated_at=now, finished_at=now)
    )
    if notify:
        connection.execute(select(func.pg_notify(CHANNEL, encode_notice(tenant, response_id))))
    return _stored(row, status="cancelled", resource=resource), True


def _delete(tenant: str, response_id: str, connection: Connection, *, lock_root: bool) -> bool:
    """``lock_root``: take the chain's root row for update first (PostgreSQL; SQLite's
    one writer serializes deletes anyway)."""
    path = _ancestry(connection, tenant, response_id, visible_start=True)
    if not path:
        return False
    if lock_root:
        root = path[-1].id
        connection.execute(select(responses.c.id).where(responses.c.id == root).with_for_update())
    now = _now_ms()
    marked = connection.execute(
        update(responses)
        .where(_visible(tenant, response_id))
        .values(deleted_at=now, updated_at=now)
    )
    if marked.rowcount == 0:
        return False
    connection.execute(delete(event_rows).where(event_rows.c.response_id == response_id))
    unneeded = _unneeded_after_delete(connection, tenant, response_id)
    for start in range(0, len(unneeded), PURGE_BATCH):
        batch = unneeded[start : start + PURGE_BATCH]
        connection.execute(delete(items).where(items.c.response_id.in_(batch)))
        connection.execute(delete(event_rows).where(event_rows.c.response_id.in_(batch)))
    return True


_STORED_COLUMNS = (
    responses.c.id,
    responses.c.tenant,
    responses.c.status,
    responses.c.created_at,
    responses.c.model,
    responses.c.previous_response_id,
    responses.c.instructions,
    responses.c.tools,
    responses.c.resource,
    responses.c.background,
)

_BY_ID = (responses.c.id == bindparam("b_id")) & (responses.c.tenant == bindparam("b_tenant"))
_GET = select(*_STORED_COLUMNS).where(_BY_ID & responses.c.deleted_at.is_(None))
_EVENTS = (select(event_rows.c.body).join(responses, responses.c.id == event_rows.c.response_id)
           .where(_BY_ID & responses.c.deleted_at.is_(None)))
_LOCK = Direct(
    select(responses.c.status, responses.c.finished_at, responses.c.deleted_at).where(_BY_ID).with_for_update()
)
_FINISH = Direct(update(responses).where(_BY_ID & responses.c.deleted_at.is_(None) & responses.c.finished_at.is_(None)))
"""A running response's end; it matches no row once the response was deleted or ended
(a cancel ends it too: every end sets ``finished_at``), or if it was never begun."""
"""The statements of the hot path, built once: SQLAlchemy compiles each once and reuses
the compiled form, where one built per call pays for its construction and cache key."""


def _stored(row: Row[Any], *, status: str | None = None, resource: JSON | None = None) -> StoredResponse:
    return StoredResponse(
        id=row.id,
        tenant=row.tenant,
        status=status or row.status,
        created_at=row.created_at,
        model=row.model,
        previous_response_id=row.previous_response_id,
        instructions=row.instructions,
        tools=row.tools,
        resource=resource if resource is not None else row.resource,
        background=bool(row.background),
    )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _visible(tenant: str, response_id: str) -> ColumnElement[bool]:
    return (
        (responses.c.id == response_id) & (responses.c.tenant == tenant) & responses.c.deleted_at.is_(None)
    )


def _item_rows(response_id: str, role: str, documents: Sequence[JSON]) -> list[dict[str, Any]]:
    return [
        {
            "response_id": response_id,
            "role": role,
            "position": position,
            "item_id": _item_id(document),
            "item": document,
        }
        for position, document in enumerate(documents)
    ]


def _item_id(document: JSON) -> str | None:
    value = document.get("id")
    return _plain_text(value) if isinstance(value, str) else None


def _plain_text(value: str | None) -> str | None:
    """A client's text for a plain text column: PostgreSQL's ``text`` cannot hold NUL
    (``invalid byte sequence for encoding "UTF8": 0x00``), so a request whose
    ``instructions`` or item id held one failed to be recorded. NUL becomes U+FFFD in
    these columns only; the response's own JSON (``resource``, the items), which every
    read serves, keeps it (JSON escapes it as ``\\u0000``)."""
    return value.replace("\x00", "\ufffd") if value and "\x00" in value else value


def _ancestry_cte(
    tenant: str, response_id: str, *, visible_start: bool, through_deleted_only: bool = False
) -> CTE:
    """``response_id`` and its ancestors (``depth`` 0 = the start), as a recursive CTE.
    ``visible_start`` requires the start to be visible; ``through_deleted_only`` stops
    the walk after the first ancestor that is not deleted."""
    start = select(
        responses.c.id,
        responses.c.previous_response_id,
        responses.c.deleted_at,
        literal_column("0").label("depth"),
    ).where(responses.c.id == response_id, responses.c.tenant == tenant)
    if visible_start:
        start = start.where(responses.c.deleted_at.is_(None))
    ancestry = start.cte("ancestry", recursive=True)
    parent = responses.alias("parent")
    step = (
        select(parent.c.id, parent.c.previous_response_id, parent.c.deleted_at, ancestry.c.depth + 1)
        .join(ancestry, parent.c.id == ancestry.c.previous_response_id)
        .where(parent.c.tenant == tenant, ancestry.c.depth < MAX_CHAIN_DEPTH)
    )
    if through_deleted_only:
        step = step.where(ancestry.c.deleted_at.is_not(None))
    return ancestry.union_all(step)


def _ancestry(
    connection: Connection,
    tenant: str,
    response_id: str,
    *,
    visible_start: bool,
    through_deleted_only: bool = False,
) -> Sequence[Row[Any]]:
    ancestry = _ancestry_cte(
        tenant, response_id, visible_start=visible_start, through_deleted_only=through_deleted_only
    )
    return (connection.execute(select(ancestry).order_by(ancestry.c.depth))).all()


class _Locked(NamedTuple):
    status: str
    finished_at: int | None
    deleted_at: int | None


def _lock_for_update(connection: Connection, tenant: str, response_id: str) -> _Locked:
    row = _LOCK.first(connection, {"b_tenant": tenant, "b_id": response_id})
    if row is None:
        raise StoreConflict(f"Response '{response_id}' was never begun.")
    return _Locked(*row)


def _unneeded_after_delete(connection: Connection, tenant: str, response_id: str) -> list[str]:
    """The responses whose items nobody needs once ``response_id`` is deleted: it and
    its deleted ancestors, from the bottom up, as long as none has a visible descendant.

    One walk up (through deleted ancestors), one walk down from the topmost of them
    (through deleted responses only: below a visible one nothing matters).
    """
    walk_up = _ancestry(connection, tenant, response_id, visible_start=False, through_deleted_only=True)
    path = [row.id for row in walk_up if row.deleted_at is not None]
    if not path:
        return []
    below = responses.alias("child")
    start = select(responses.c.id, responses.c.previous_response_id, responses.c.deleted_at).where(
        responses.c.id == path[-1]
    )
    subtree = start.cte("subtree", recursive=True)
    subtree = subtree.union_all(
        select(below.c.id, below.c.previous_response_id, below.c.deleted_at)
        .join(subtree, below.c.previous_response_id == subtree.c.id)
        .where(subtree.c.deleted_at.is_not(None))
    )
    nodes = (connection.execute(select(subtree))).all()
    parent_of = {node.id: node.previous_response_id for node in nodes}
    depth_on_path = {node_id: depth for depth, node_id in enumerate(path)}
    needed_from = len(path)
    for node in nodes:
        if node.deleted_at is not None:
            continue
        ancestor = node.previous_response_id
        while ancestor is not None and ancestor not in depth_on_path:
            ancestor = parent_of.get(ancestor)
        if ancestor is not None:
            needed_from = min(needed_from, depth_on_path[ancestor])
    return path[:needed_from]


def _fail_rows_of(connection: Connection, *, owner: str) -> int:
    rows = (
        connection.execute(
            select(responses.c.id, responses.c.resource)
            .where(responses.c.owner == owner, responses.c.finished_at.is_(None))
            .with_for_update()
        )
    ).all()
    if not rows:
        return 0
    now = _now_ms()
    connection.execute(
        update(responses)
        .where(responses.c.id == bindparam("failed_id"))
        .values(
            status="failed",
            resource=bindparam("failed_resource", type_=responses.c.resource.type),
            updated_at=now,
            finished_at=now,
        ),
        [{"failed_id": row.id, "failed_resource": failed_resource(row.resource)} for row in rows],
    )
    return len(rows)


def failed_resource(resource: JSON) -> JSON:
    """The snapshot of a response its server never finished: every field kept, the
    status ``failed`` with a ``server_restarted`` error."""
    return {
        **resource,
        "status": "failed",
        "error": {"code": RESTARTED_CODE, "message": RESTARTED_MESSAGE},
    }



def cancelled_resource(resource: JSON) -> JSON:
    """The snapshot of a response cancelled by a client where it is not running: the
    latest snapshot, with ``status: "cancelled"`` (not ``incomplete``: no details)."""
    return {**resource, "status": "cancelled", "incomplete_details": None}
