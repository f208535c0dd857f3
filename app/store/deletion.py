"""Deleting responses: writes (and the read retention makes first) as plain functions of
a connection and plain values, like those of :mod:`app.store.statements`.

A deleted response stays as a hidden row (a tombstone, :func:`tombstone`) without its
content: its JSON, instructions and events are removed at once (nothing can read them
any more), its offered tools with its items. Its items are removed as soon as no visible
response descending from it needs them: deleting a response walks up through its deleted
ancestors and removes the items of every one that has no visible descendant left. So
deleting the last turn of a conversation frees its items at once; deleting a middle turn
keeps its items until the turns after it are deleted too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, Select, Text, bindparam, delete, select, update
from sqlalchemy.engine import Connection

from app.store.base import JSON
from app.store.reads import ancestry_cte, visible_where
from app.store.schema import events as event_rows
from app.store.schema import items, now_ms, responses

PURGE_BATCH = 500
"""Responses whose items one statement removes, at most."""


def tombstone(response_id: str) -> JSON:
    """What a deleted response's row keeps of its JSON: its id, no content. The row
    itself stays (``previous_response_id`` always points at a row); of what the client
    sent and the model wrote, only what a visible response's chain still needs stays
    (items, and the offered tools of each link), until no visible response needs it."""
    return {"id": response_id, "object": "response", "deleted": True}


def write_delete(tenant: str, response_id: str, connection: Connection, *, lock_root: bool) -> bool:
    """Delete a visible response; ``False`` if there was none. ``lock_root``: take the
    chain's root row for update first (PostgreSQL, where deletes in one chain are then
    serialized; SQLite's one writer serializes every write anyway)."""
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


def _walk(*, visible_start: bool, through_deleted_only: bool) -> Select[Any]:
    ancestry = ancestry_cte(visible_start=visible_start, through_deleted_only=through_deleted_only)
    return select(ancestry).order_by(ancestry.c.depth)


_ANCESTRY = {(visible_start, through_deleted_only): _walk(visible_start=visible_start,
                                                         through_deleted_only=through_deleted_only)
             for visible_start, through_deleted_only in ((True, False), (False, True))}


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
    connection: Connection, tenant: str, response_id: str, *, visible_start: bool, through_deleted_only: bool = False
) -> Sequence[Row[Any]]:
    statement = _ANCESTRY[(visible_start, through_deleted_only)]
    return connection.execute(statement, {"b_tenant": tenant, "b_id": response_id}).all()


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
