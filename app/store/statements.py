"""The writes of a response's life, as plain functions of a connection and plain values:
its start (:func:`write_begin`), its end (:func:`write_finish`), both at once
(:func:`write_record`), a step between (:func:`write_status`), a client's cancel
(:func:`write_cancel`) and recovery's failing of a dead owner's rows
(:func:`fail_rows_of`). Deletes are in :mod:`app.store.deletion`, reads in
:mod:`app.store.reads`. :class:`app.store.sql.SqlResponseStore` decides when each runs,
and in which transaction (:mod:`app.store.group_commit`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from app.errors import PreviousResponseNotFound
from app.protocol.states import ResponseStatus
from app.store import one_statement
from app.store.base import JSON, Document, NewResponse, StoreConflict, StoredResponse
from app.store.cancels import CHANNEL, encode_notice
from app.store.reads import BY_ID, STORED_COLUMNS, stored_response, visible_where
from app.store.schema import NON_TERMINAL, TERMINAL, Serialized, items, now_ms, responses
from app.store.schema import events as event_rows

RESTARTED_CODE = "server_restarted"
RESTARTED_MESSAGE = "The server stopped before this response finished; it was not completed."


# -- statements ------------------------------------------------------------------------

_INSERT_RESPONSE = insert(responses)
_INSERT_ITEM = insert(items)
_INSERT_EVENTS = insert(event_rows)
_LOCK = select(responses.c.status, responses.c.finished_at, responses.c.deleted_at).where(BY_ID).with_for_update()
_HOLD = select(responses.c.id).where(BY_ID & responses.c.deleted_at.is_(None)).with_for_update(read=True)
"""A continuation's previous response, if visible (SQLite; PostgreSQL holds it in the
insert's own statement)."""
_FINISH = update(responses).where(BY_ID & responses.c.deleted_at.is_(None) & responses.c.finished_at.is_(None))
"""A running response's end; it matches no row once the response was deleted or ended
(a cancel ends it too: every end sets ``finished_at``), or if it was never begun."""


def status_of(resource: Document) -> Any:
    return resource.status if isinstance(resource, Serialized) else resource.get("status")


def terminal_status(resource: Document) -> str:
    """The status of a response's final snapshot, which must be terminal."""
    status = status_of(resource)
    if status not in TERMINAL:
        raise ValueError(f"a finished response has a terminal status, not {status!r}")
    return status  # type: ignore[no-any-return]


def begin_rows(
    response: NewResponse, owner: str, *, final: JSON | None = None, output_items: Sequence[JSON] = ()
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The row of a response ``owner`` runs and its items' rows; with ``final`` (the
    terminal columns) and ``output_items``, a response recorded whole."""
    if response.status not in NON_TERMINAL:
        raise ValueError(f"a response begins queued or in_progress, not {response.status!r}")
    row = {
        "id": response.id,
        "tenant": response.tenant,
        "status": response.status,
        "created_at": response.created_at,
        "model": response.model,
        "previous_response_id": response.previous_response_id,
        "instructions": plain_text(response.instructions),
        "tools": response.tools,
        "resource": response.resource,
        "background": response.background,
        "owner": owner,
        "updated_at": now_ms(),
    } | (final or {})
    item_rows = rows_of_items(response.id, "input", response.input_items)
    item_rows += rows_of_items(response.id, "output", output_items)
    return row, item_rows


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
        if connection.execute(_HOLD, {"b_tenant": row["tenant"], "b_id": previous}).first() is None:
            raise _previous_not_found(previous)
    try:
        if postgresql:
            if not one_statement.insert_response(connection, row, item_rows, None if body is None else body()):
                raise _previous_not_found(previous)
            return
        connection.execute(_INSERT_RESPONSE, row)
    except IntegrityError as error:
        raise StoreConflict(f"Response '{row['id']}' already exists.") from error
    if item_rows:
        connection.execute(_INSERT_ITEM, item_rows)
    if body is not None:
        connection.execute(_INSERT_EVENTS, {"response_id": row["id"], "body": body()})


def _previous_not_found(previous: str | None) -> PreviousResponseNotFound:
    return PreviousResponseNotFound(f"Previous response with id '{previous}' not found.", param="previous_response_id")


def write_finish(tenant: str, response_id: str, status: str, resource: Document, output_rows: list[dict[str, Any]],
                 body: Callable[[], bytes] | None, connection: Connection) -> bool:
    """The end of a running response: its final snapshot, its output items and its
    events (none kept: ``body`` is ``None``). ``False`` (nothing written) if it was
    cancelled or deleted meanwhile; :class:`StoreConflict` if it had already ended."""
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
        finished = connection.execute(_FINISH, params).rowcount
    if not finished:
        current = _lock_for_update(connection, tenant, response_id)
        if current.deleted_at is not None or current.status == ResponseStatus.CANCELLED:
            return False
        raise StoreConflict(f"Response '{response_id}' has already finished ({current.status}).")
    if not postgresql:
        if output_rows:
            connection.execute(_INSERT_ITEM, output_rows)
        if body is not None:
            connection.execute(_INSERT_EVENTS, {"response_id": response_id, "body": body()})
    return True


def write_status(tenant: str, response_id: str, status: str, resource: Document, connection: Connection) -> None:
    """A running response moves (``queued`` to ``in_progress``, or to ``cancelled``);
    one cancelled or deleted meanwhile is left as it is."""
    current = _lock_for_update(connection, tenant, response_id)
    if current.deleted_at is not None or current.status == ResponseStatus.CANCELLED:
        return
    if current.finished_at is not None:
        raise StoreConflict(f"Response '{response_id}' has already finished ({current.status}).")
    now = now_ms()
    values: dict[str, Any] = {"status": status, "resource": resource, "updated_at": now}
    if status == ResponseStatus.CANCELLED:
        values["finished_at"] = now
    connection.execute(update(responses).where(responses.c.id == response_id).values(values))


def write_cancel(tenant: str, response_id: str, connection: Connection, *,
                 notify: bool) -> tuple[StoredResponse | None, bool]:
    """A client's cancel: the response as stored, and whether this cancelled it.
    ``notify``: send ``pg_notify`` at commit, and only if the cancel commits (PostgreSQL)."""
    row = (
        connection.execute(select(*STORED_COLUMNS).where(visible_where(tenant, response_id)).with_for_update())
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
        .values(status=ResponseStatus.CANCELLED, resource=resource, updated_at=now, finished_at=now)
    )
    if notify:
        connection.execute(select(func.pg_notify(CHANNEL, encode_notice(tenant, response_id))))
    return stored_response(row, status=ResponseStatus.CANCELLED, resource=resource), True


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


class _Locked(NamedTuple):
    status: str
    finished_at: int | None
    deleted_at: int | None


def _lock_for_update(connection: Connection, tenant: str, response_id: str) -> _Locked:
    row = connection.execute(_LOCK, {"b_tenant": tenant, "b_id": response_id}).first()
    if row is None:
        raise StoreConflict(f"Response '{response_id}' was never begun.")
    return _Locked(*row)


def fail_rows_of(connection: Connection, *, owner: str) -> int:
    """Every response of a dead ``owner`` left unfinished becomes ``failed``; how many."""
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
            status=ResponseStatus.FAILED,
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
        "status": ResponseStatus.FAILED,
        "error": {"code": RESTARTED_CODE, "message": RESTARTED_MESSAGE},
    }


def cancelled_resource(resource: JSON) -> JSON:
    """The snapshot of a response cancelled by a client where it is not running: the
    latest snapshot, with ``status: "cancelled"`` (not ``incomplete``: no details)."""
    return {**resource, "status": ResponseStatus.CANCELLED, "incomplete_details": None}
