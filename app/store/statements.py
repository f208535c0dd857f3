"""The store's SQL: its statements, built once, and its reads and writes as plain
functions of a connection and plain values (a write is sent to SQLite's writer process
as such a function, pickled by reference: :mod:`app.store.sqlite_writer`).
:class:`app.store.sql.SqlResponseStore` decides when each runs, and in which transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    CTE,
    CompoundSelect,
    Integer,
    Row,
    Select,
    Text,
    bindparam,
    cast,
    delete,
    func,
    insert,
    literal_column,
    null,
    select,
    union_all,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from app.errors import PreviousResponseNotFound
from app.store import one_statement
from app.store.base import JSON, Document, StoreConflict, StoredResponse
from app.store.cancels import CHANNEL, encode_notice
from app.store.direct import Direct
from app.store.schema import TERMINAL, JsonText, Serialized, items, responses
from app.store.schema import events as event_rows

RESTARTED_CODE = "server_restarted"
RESTARTED_MESSAGE = "The server stopped before this response finished; it was not completed."
MAX_CHAIN_DEPTH = 1_000_000
"""A guard against a cycle, which the write path cannot create."""
PURGE_BATCH = 500


# -- statements ------------------------------------------------------------------------

_INSERT_RESPONSE = Direct(insert(responses))
_INSERT_ITEM = Direct(insert(items))
_INSERT_EVENTS = Direct(insert(event_rows))
"""Built once, and run on SQLite by the driver itself (:mod:`app.store.direct`), as are
``_LOCK`` and ``_FINISH`` below."""


def status_of(resource: Document) -> Any:
    return resource.status if isinstance(resource, Serialized) else resource.get("status")


# -- writes: functions of a connection and plain values, so that SQLite's writer process
# can be sent them (app.store.sqlite_writer)


def write_begin(row: dict[str, Any], item_rows: list[dict[str, Any]], connection: Connection) -> None:
    """A response's row and its items."""
    _insert(row, item_rows, None, connection)


def write_record(row: dict[str, Any], item_rows: list[dict[str, Any]], body: Callable[[], bytes] | None,
            connection: Connection) -> bool:
    """A response recorded whole: its row (already finished), its items and its events
    (none kept: ``body`` is ``None``)."""
    _insert(row, item_rows, body, connection)
    return True


def _insert(row: dict[str, Any], item_rows: list[dict[str, Any]], body: Callable[[], bytes] | None,
            connection: Connection) -> None:
    """The row, its items and its events: one statement on PostgreSQL
    (:mod:`app.store.one_statement`), one each on SQLite. A continuation's previous
    response must be visible, and is held with a share lock until the commit (a delete of
    it waits): by the same statement on PostgreSQL, by one of its own first on SQLite."""
    previous = row["previous_response_id"]
    postgresql = connection.dialect.name == "postgresql"
    if previous is not None and not postgresql:
        if _HOLD.first(connection, {"b_tenant": row["tenant"], "b_id": previous}) is None:
            raise _previous_not_found(previous)
    try:
        if postgresql:
            if not one_statement.insert_response(connection, row, item_rows, None if body is None else body()):
                raise _previous_not_found(previous)
            return
        _INSERT_RESPONSE.execute(connection, row)
    except IntegrityError as error:
        raise StoreConflict(f"Response '{row['id']}' already exists.") from error
    if item_rows:
        _INSERT_ITEM.execute(connection, item_rows)
    if body is not None:
        _INSERT_EVENTS.execute(connection, {"response_id": row["id"], "body": body()})


def _previous_not_found(previous: str | None) -> PreviousResponseNotFound:
    return PreviousResponseNotFound(f"Previous response with id '{previous}' not found.", param="previous_response_id")


def write_finish(tenant: str, response_id: str, status: str, resource: Document, output_rows: list[dict[str, Any]],
            body: Callable[[], bytes] | None, connection: Connection) -> bool:
    now = now_ms()
    # the row is locked and finished in one statement, if it is still running; only
    # otherwise is it read, to say why (one statement fewer on the usual path); on
    # PostgreSQL the same statement writes the items and events too. That statement
    # decides: the read after it may run in a transaction of its own (a write alone,
    # app.store.group_commit), as what it explains (ended, cancelled, deleted) stays so
    params = {"b_id": response_id, "b_tenant": tenant, "status": status, "resource": resource,
              "updated_at": now, "finished_at": now}
    postgresql = connection.dialect.name == "postgresql"
    if postgresql:
        finished = one_statement.finish_response(connection, params, output_rows, None if body is None else body())
    else:
        finished = _FINISH.execute(connection, params)
    if not finished:
        current = _lock_for_update(connection, tenant, response_id)
        if current.deleted_at is not None or current.status == "cancelled":
            return False
        raise StoreConflict(f"Response '{response_id}' has already finished ({current.status}).")
    if not postgresql:
        if output_rows:
            _INSERT_ITEM.execute(connection, output_rows)
        if body is not None:
            _INSERT_EVENTS.execute(connection, {"response_id": response_id, "body": body()})
    return True


def write_status(tenant: str, response_id: str, status: str, resource: Document, connection: Connection) -> None:
    current = _lock_for_update(connection, tenant, response_id)
    if current.deleted_at is not None or current.status == "cancelled":
        return
    if current.finished_at is not None:
        raise StoreConflict(f"Response '{response_id}' has already finished ({current.status}).")
    now = now_ms()
    values: dict[str, Any] = {"status": status, "resource": resource, "updated_at": now}
    if status == "cancelled":
        values["finished_at"] = now
    connection.execute(update(responses).where(responses.c.id == response_id).values(values))


def write_cancel(tenant: str, response_id: str, connection: Connection, *,
            notify: bool) -> tuple[StoredResponse | None, bool]:
    """``notify``: send ``pg_notify`` at commit, and only if the cancel commits (PostgreSQL)."""
    row = (
        connection.execute(select(*_STORED_COLUMNS).where(visible_where(tenant, response_id)).with_for_update())
    ).first()
    if row is None:
        return None, False
    if row.status in TERMINAL:
        return stored_response(row), False
    resource = cancelled_resource(row.resource)
    now = now_ms()
    connection.execute(
        update(responses)
        .where(responses.c.id == response_id)
        .values(status="cancelled", resource=resource, updated_at=now, finished_at=now)
    )
    if notify:
        connection.execute(select(func.pg_notify(CHANNEL, encode_notice(tenant, response_id))))
    return stored_response(row, status="cancelled", resource=resource), True


def write_delete(tenant: str, response_id: str, connection: Connection, *, lock_root: bool) -> bool:
    """``lock_root``: take the chain's root row for update first (PostgreSQL; SQLite's
    one writer serializes deletes anyway)."""
    path = _ancestry(connection, tenant, response_id, visible_start=True)
    if not path:
        return False
    if lock_root:
        root = path[-1].id
        connection.execute(select(responses.c.id).where(responses.c.id == root).with_for_update())
    now = now_ms()
    marked = connection.execute(
        update(responses)
        .where(visible_where(tenant, response_id))
        .values(deleted_at=now, updated_at=now, instructions=None, resource=tombstone(response_id))
    )
    if marked.rowcount == 0:
        return False
    connection.execute(delete(event_rows).where(event_rows.c.response_id == response_id))
    unneeded = _unneeded_after_delete(connection, tenant, response_id)
    for start in range(0, len(unneeded), PURGE_BATCH):
        batch = unneeded[start : start + PURGE_BATCH]
        connection.execute(delete(items).where(items.c.response_id.in_(batch)))
        connection.execute(delete(event_rows).where(event_rows.c.response_id.in_(batch)))
        connection.execute(update(responses).where(responses.c.id.in_(batch)).values(tools=[]))
    return True


def expired(created_before: int, limit: int, connection: Connection) -> list[tuple[str, str]]:
    """``(tenant, id)`` of up to ``limit`` visible, finished responses created before
    ``created_before`` (Unix seconds), oldest first (so a chain's older links come
    before its later ones)."""
    query = (
        select(responses.c.tenant, responses.c.id)
        .where(responses.c.created_at < created_before, responses.c.deleted_at.is_(None),
               responses.c.finished_at.is_not(None))
        .order_by(responses.c.created_at, responses.c.id)
        .limit(limit)
    )
    return [(row.tenant, row.id) for row in connection.execute(query)]


def delete_many(rows: list[tuple[str, str]], connection: Connection, *, lock_root: bool) -> int:
    """:func:`write_delete` of each ``(tenant, id)``, in order; how many were deleted (one
    deleted meanwhile is not)."""
    return sum(write_delete(tenant, response_id, connection, lock_root=lock_root) for tenant, response_id in rows)


def tombstone(response_id: str) -> JSON:
    """What a deleted response's row keeps of its JSON: its id, no content. The row
    itself stays (``previous_response_id`` always points at a row); of what the client
    sent and the model wrote, only what a visible response's chain still needs stays
    (items, and the offered tools of each link), until no visible response needs it."""
    return {"id": response_id, "object": "response", "deleted": True}


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
GET_RESPONSE = select(*_STORED_COLUMNS).where(_BY_ID & responses.c.deleted_at.is_(None))
EVENTS_OF = (select(event_rows.c.body).join(responses, responses.c.id == event_rows.c.response_id)
           .where(_BY_ID & responses.c.deleted_at.is_(None)))
_LOCK = Direct(
    select(responses.c.status, responses.c.finished_at, responses.c.deleted_at).where(_BY_ID).with_for_update()
)
_HOLD = Direct(select(responses.c.id).where(_BY_ID & responses.c.deleted_at.is_(None)).with_for_update(read=True))
"""A continuation's previous response, if visible (SQLite; PostgreSQL holds it in the
insert's own statement)."""
_FINISH = Direct(update(responses).where(_BY_ID & responses.c.deleted_at.is_(None) & responses.c.finished_at.is_(None)))
"""A running response's end; it matches no row once the response was deleted or ended
(a cancel ends it too: every end sets ``finished_at``), or if it was never begun."""
"""The statements of the hot path, built once: SQLAlchemy compiles each once and reuses
the compiled form, where one built per call pays for its construction and cache key."""


def stored_response(row: Row[Any], *, status: str | None = None, resource: JSON | None = None) -> StoredResponse:
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


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def visible_where(tenant: str, response_id: str) -> ColumnElement[bool]:
    return (
        (responses.c.id == response_id) & (responses.c.tenant == tenant) & responses.c.deleted_at.is_(None)
    )


def rows_of_items(response_id: str, role: str, documents: Sequence[JSON]) -> list[dict[str, Any]]:
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
    return plain_text(value) if isinstance(value, str) else None


def plain_text(value: str | None) -> str | None:
    """A client's text for a plain text column: PostgreSQL's ``text`` cannot hold NUL
    (``invalid byte sequence for encoding "UTF8": 0x00``), so a request whose
    ``instructions`` or item id held one failed to be recorded. NUL becomes U+FFFD in
    these columns only; the response's own JSON (``resource``, the items), which every
    read serves, keeps it (JSON escapes it as ``\\u0000``)."""
    return value.replace("\x00", "\ufffd") if value and "\x00" in value else value


def _ancestry_cte(*, visible_start: bool, through_deleted_only: bool = False) -> CTE:
    """The response ``b_id`` of tenant ``b_tenant`` and its ancestors (``depth`` 0 = the
    start), as a recursive CTE. ``visible_start`` requires the start to be visible;
    ``through_deleted_only`` stops the walk after the first ancestor that is not deleted."""
    tenant = bindparam("b_tenant", type_=Text)
    start = select(
        responses.c.id,
        responses.c.previous_response_id,
        responses.c.deleted_at,
        literal_column("0").label("depth"),
    ).where(responses.c.id == bindparam("b_id", type_=Text), responses.c.tenant == tenant)
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


def _chain_query() -> CompoundSelect:
    ancestry = _ancestry_cte(visible_start=True)
    links = select(
        ancestry.c.depth, ancestry.c.id.label("response_id"), responses.c.tools,
        cast(null(), Text).label("role"), cast(null(), Integer).label("position"), cast(null(), JsonText).label("item"),
    ).join(responses, responses.c.id == ancestry.c.id)
    own_items = select(
        cast(null(), Integer), items.c.response_id, cast(null(), JsonText), items.c.role, items.c.position,
        items.c.item,
    ).where(items.c.response_id.in_(select(ancestry.c.id)))
    return union_all(links, own_items).order_by(literal_column("position"))


CHAIN = _chain_query()
"""A visible response's chain in one statement (parameters ``b_tenant``, ``b_id``): a row
per link (``depth``: 0 for the response, up to its oldest ancestor; its ``tools``) and a
row per item of any link (``depth`` NULL; ``role``, ``item``), items in ``position``
order. No row: the response is not visible. One statement is one snapshot, which two
took a ``REPEATABLE READ`` transaction for; the ancestry is walked once.

This and the other statements that walk a chain are built once, with bound parameters:
building one of these recursive queries took about 0.3-0.6 ms of Python per call (on the
event loop for a chain read), several times what running it took."""


def _walk(**kind: bool) -> Select[Any]:
    ancestry = _ancestry_cte(**kind)
    return select(ancestry).order_by(ancestry.c.depth)


_ANCESTRY = {kind: _walk(visible_start=kind[0], through_deleted_only=kind[1])
             for kind in ((True, False), (False, True))}


def _subtree() -> Select[Any]:
    below = responses.alias("child")
    start = select(responses.c.id, responses.c.previous_response_id, responses.c.deleted_at).where(
        responses.c.id == bindparam("b_top", type_=Text)
    )
    subtree = start.cte("subtree", recursive=True)
    subtree = subtree.union_all(
        select(below.c.id, below.c.previous_response_id, below.c.deleted_at)
        .join(subtree, below.c.previous_response_id == subtree.c.id)
        .where(subtree.c.deleted_at.is_not(None))
    )
    return select(subtree)


_SUBTREE = _subtree()
"""The response ``b_top`` and its descendants, walking down through deleted ones only."""


def _ancestry(
    connection: Connection,
    tenant: str,
    response_id: str,
    *,
    visible_start: bool,
    through_deleted_only: bool = False,
) -> Sequence[Row[Any]]:
    statement = _ANCESTRY[(visible_start, through_deleted_only)]
    return connection.execute(statement, {"b_tenant": tenant, "b_id": response_id}).all()


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
    nodes = connection.execute(_SUBTREE, {"b_top": path[-1]}).all()
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


def fail_rows_of(connection: Connection, *, owner: str) -> int:
    rows = (
        connection.execute(
            select(responses.c.id, responses.c.resource)
            .where(responses.c.owner == owner, responses.c.finished_at.is_(None))
            .with_for_update()
        )
    ).all()
    if not rows:
        return 0
    now = now_ms()
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
