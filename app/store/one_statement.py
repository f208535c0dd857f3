"""PostgreSQL: a response's row, its items and its events written in one statement.

On PostgreSQL every statement of a write is a round trip to the server. Written plainly,
a stored stream's end is three statements (the row's update, its output items, its
events) and its start two (the row, its input items), besides the transaction's own.
Here each is one statement: the row's ``INSERT`` or ``UPDATE`` is a data-modifying
``WITH`` query whose ``RETURNING`` feeds the inserts of the items (all of them, from
arrays: ``unnest``) and of the events, which write nothing when it wrote nothing (the
response was deleted, cancelled or ended meanwhile). The statement answers how many rows
it wrote (0 or 1). A continuation's row is inserted only if its previous response is
visible, which the same statement holds with a share lock.

The statements are SQLAlchemy Core over the tables of :mod:`app.store.schema`, built
once and run with ``Connection.execute`` (SQLAlchemy caches their compiled form); the
values go through the columns' own types (JSON documents as their text, exactly).
SQLite keeps the plain statements of :mod:`app.store.statements`: its writes are calls
into the library on the writer thread, where a statement costs no round trip, and it
has no ``RETURNING`` in ``WITH``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import CTE, Integer, LargeBinary, Select, Text, bindparam, exists, func, insert, select, true, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection

from app.store.schema import JsonText, items, responses
from app.store.schema import events as event_rows

_ITEM_COLUMNS = ("role", "position", "item_id", "item")
_ITEM_ARRAYS = {"role": Text, "position": Integer, "item_id": Text, "item": JsonText}


def _items_from(written: CTE) -> CTE:
    """Insert the items given as arrays (``i_role``, ``i_position``, ``i_item_id``,
    ``i_item``: one element per item), for the row ``written`` returned, if it did."""
    given = func.unnest(
        *(bindparam(f"i_{name}", type_=ARRAY(kind)) for name, kind in _ITEM_ARRAYS.items())
    ).table_valued(*_ITEM_COLUMNS).render_derived(name="given")
    rows = select(written.c.id, *(given.c[name] for name in _ITEM_COLUMNS)).select_from(written).join(given, true())
    return insert(items).from_select(["response_id", *_ITEM_COLUMNS], rows).cte("written_items")


def _events_from(written: CTE) -> CTE:
    """Insert the events' body (``e_body``) for the row ``written`` returned, if it did."""
    rows = select(written.c.id, bindparam("e_body", type_=LargeBinary)).select_from(written)
    return insert(event_rows).from_select(["response_id", "body"], rows).cte("written_events")


def _counted(written: CTE, *more: CTE) -> Select[int]:
    return select(func.count()).select_from(written).add_cte(*more)


def _finish(with_events: bool) -> Select[int]:
    finished = (
        update(responses)
        .where(
            (responses.c.id == bindparam("b_id"))
            & (responses.c.tenant == bindparam("b_tenant"))
            & responses.c.deleted_at.is_(None)
            & responses.c.finished_at.is_(None)
        )
        .values(
            status=bindparam("status", type_=Text),
            resource=bindparam("resource", type_=JsonText),
            updated_at=bindparam("updated_at"),
            finished_at=bindparam("finished_at"),
        )
        .returning(responses.c.id)
        .cte("finished")
    )
    return _counted(finished, _items_from(finished), *([_events_from(finished)] if with_events else []))


def _insert(with_events: bool, continuation: bool) -> Select[int]:
    """The row, from its values; a ``continuation`` only if its previous response is
    visible, which it then holds with a share lock until the commit (a delete of it waits),
    as :mod:`app.store.statements` does with a statement of its own on SQLite."""
    values = {column.name: bindparam(f"r_{column.name}", type_=column.type) for column in responses.columns}
    if continuation:
        previous = responses.alias("previous")
        held = (
            select(previous.c.id)
            .where(
                (previous.c.id == values["previous_response_id"])
                & (previous.c.tenant == values["tenant"])
                & previous.c.deleted_at.is_(None)
            )
            .with_for_update(read=True)
        )
        row = insert(responses).from_select(list(values), select(*values.values()).where(exists(held)))
    else:
        row = insert(responses).values(values)
    begun = row.returning(responses.c.id).cte("begun")
    return _counted(begun, _items_from(begun), *([_events_from(begun)] if with_events else []))


_FINISH = {False: _finish(False), True: _finish(True)}
_INSERT = {(events, continuation): _insert(events, continuation) for events in (False, True)
           for continuation in (False, True)}


def _item_arrays(item_rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {
        "i_role": [row["role"] for row in item_rows],
        "i_position": [row["position"] for row in item_rows],
        "i_item_id": [row["item_id"] for row in item_rows],
        "i_item": [row["item"] for row in item_rows],
    }


def insert_response(connection: Connection, row: dict[str, Any], item_rows: list[dict[str, Any]],
                    body: bytes | None) -> int:
    """The response's row (a column it lacks is NULL), its items and (``body``) its
    events. Returns 1, or 0 (nothing written) if its previous response is not visible;
    raises SQLAlchemy's ``IntegrityError`` if the id is taken."""
    params: dict[str, Any] = {f"r_{column.name}": row.get(column.name) for column in responses.columns}
    params.update(_item_arrays(item_rows))
    if body is not None:
        params["e_body"] = body
    return connection.execute(_INSERT[body is not None, row.get("previous_response_id") is not None],
                              params).scalar_one()


def finish_response(connection: Connection, params: dict[str, Any], output_rows: list[dict[str, Any]],
                    body: bytes | None) -> int:
    """The end of a running response (``params``: ``b_id``, ``b_tenant``, ``status``,
    ``resource``, ``updated_at``, ``finished_at``), its output items and (``body``) its
    events. Returns 1, or 0 (nothing written) if the response is not running."""
    values = {**params, **_item_arrays(output_rows)}
    if body is not None:
        values["e_body"] = body
    return connection.execute(_FINISH[body is not None], values).scalar_one()

