"""Conversations: a tenant's lists of items, as OpenAI's Conversations API keeps them
(``/v1/conversations``), in the response store's database (SQLite or PostgreSQL), so
every worker and replica sharing it sees the same.

Each function here is a plain function of a connection, run by
:class:`SqlConversations` in one transaction (a write: :meth:`~app.store.sql.SqlResponseStore`'s
writer, SQLite's one thread or PostgreSQL's pool; a read: one snapshot). Items are
numbered by ``position`` as they are added: adding takes the conversation's row for
update, so two writers that add at once are ordered, never interleaved within one add.
An item's id is its conversation's once (400 ``duplicate_item`` for an id it already
holds). A conversation is another tenant's or absent alike: ``None``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection

from app.errors import InvalidRequest
from app.store.base import JSON, ConversationTurn, ItemPage, Order
from app.store.schema import conversation_items, conversations, now_ms

T = TypeVar("T")
Run = Callable[[Callable[[Connection], T]], Awaitable[T]]


def conversation_object(row: Any) -> JSON:
    """A conversation as the API shows it."""
    return {"id": row.id, "object": "conversation", "created_at": row.created_at, "metadata": row.metadata}


def _mine(tenant: str, conversation_id: str) -> Any:
    return (conversations.c.id == conversation_id) & (conversations.c.tenant == tenant)


def _row(connection: Connection, tenant: str, conversation_id: str, *, lock: bool = False) -> Any:
    query = select(conversations).where(_mine(tenant, conversation_id))
    return connection.execute(query.with_for_update() if lock else query).first()


def create(tenant: str, conversation_id: str, metadata: JSON, items: Sequence[JSON], connection: Connection) -> JSON:
    now = now_ms()
    connection.execute(insert(conversations).values(
        id=conversation_id, tenant=tenant, created_at=now // 1000, metadata=metadata, next_position=0,
        updated_at=now))
    if items:
        _append(connection, conversation_id, 0, items)
    return conversation_object(_row(connection, tenant, conversation_id))


def get(tenant: str, conversation_id: str, connection: Connection) -> JSON | None:
    row = _row(connection, tenant, conversation_id)
    return None if row is None else conversation_object(row)


def set_metadata(tenant: str, conversation_id: str, metadata: JSON, connection: Connection) -> JSON | None:
    changed = connection.execute(update(conversations).where(_mine(tenant, conversation_id))
                                 .values(metadata=metadata, updated_at=now_ms())).rowcount
    return get(tenant, conversation_id, connection) if changed else None


def remove(tenant: str, conversation_id: str, connection: Connection) -> bool:
    """The conversation and its items; ``False`` if there was none."""
    if _row(connection, tenant, conversation_id, lock=True) is None:
        return False
    connection.execute(delete(conversation_items).where(conversation_items.c.conversation_id == conversation_id))
    connection.execute(delete(conversations).where(conversations.c.id == conversation_id))
    return True


def add(tenant: str, conversation_id: str, items: Sequence[JSON], connection: Connection) -> list[JSON] | None:
    """``items`` appended in order; ``None`` if there is no such conversation."""
    row = _row(connection, tenant, conversation_id, lock=True)
    if row is None:
        return None
    _append(connection, conversation_id, row.next_position, items)
    return list(items)


def _append(connection: Connection, conversation_id: str, first: int, items: Sequence[JSON]) -> None:
    ids = [item["id"] for item in items]
    taken = set(connection.scalars(select(conversation_items.c.item_id).where(
        conversation_items.c.conversation_id == conversation_id, conversation_items.c.item_id.in_(ids))))
    for index, item_id in enumerate(ids):
        if item_id in taken or item_id in ids[:index]:
            raise InvalidRequest(f"The conversation already holds an item with id '{item_id}'.",
                                 code="duplicate_item", param=f"items[{index}].id")
    connection.execute(insert(conversation_items), [
        {"conversation_id": conversation_id, "position": first + index, "item_id": item["id"], "item": item}
        for index, item in enumerate(items)])
    connection.execute(update(conversations).where(conversations.c.id == conversation_id)
                       .values(next_position=first + len(items), updated_at=now_ms()))


def page(tenant: str, conversation_id: str, limit: int, order: Order, after: str | None,
         connection: Connection) -> ItemPage | None:
    """Up to ``limit`` items after the cursor ``after`` (an item id; one that is not
    among them gives an empty page), in ``order`` (``desc``: newest first)."""
    if _row(connection, tenant, conversation_id) is None:
        return None
    ascending = order == "asc"
    own = conversation_items.c.conversation_id == conversation_id
    query = select(conversation_items.c.item).where(own)
    if after is not None:
        cursor = select(func.min(conversation_items.c.position)).where(
            own, conversation_items.c.item_id == after).scalar_subquery()
        query = query.where(conversation_items.c.position > cursor if ascending
                            else conversation_items.c.position < cursor)
    position = conversation_items.c.position
    rows = connection.scalars(query.order_by(position.asc() if ascending else position.desc()).limit(limit + 1)).all()
    return ItemPage(data=list(rows[:limit]), has_more=len(rows) > limit)


def item(tenant: str, conversation_id: str, item_id: str, connection: Connection) -> tuple[bool, JSON | None]:
    """Whether the conversation is there, and its item ``item_id`` if it holds one."""
    if _row(connection, tenant, conversation_id) is None:
        return False, None
    found = connection.scalar(select(conversation_items.c.item).where(
        conversation_items.c.conversation_id == conversation_id, conversation_items.c.item_id == item_id))
    return True, found


def remove_item(tenant: str, conversation_id: str, item_id: str, connection: Connection) -> tuple[JSON | None, bool]:
    """The conversation (``None`` if absent) and whether its item ``item_id`` was removed."""
    row = _row(connection, tenant, conversation_id, lock=True)
    if row is None:
        return None, False
    removed = connection.execute(delete(conversation_items).where(
        conversation_items.c.conversation_id == conversation_id, conversation_items.c.item_id == item_id)).rowcount
    if removed:
        connection.execute(update(conversations).where(conversations.c.id == conversation_id)
                           .values(updated_at=now_ms()))
    return conversation_object(row), bool(removed)


def history(tenant: str, conversation_id: str, connection: Connection) -> list[JSON] | None:
    """Every item, oldest first (a response's context); ``None`` if absent."""
    if _row(connection, tenant, conversation_id) is None:
        return None
    return list(connection.scalars(select(conversation_items.c.item).where(
        conversation_items.c.conversation_id == conversation_id).order_by(conversation_items.c.position)))


STALE_HOLD_MS = 30 * 60 * 1000
"""A hold older than this is taken to be a dead server's (its response ended without
releasing it) and may be taken over: half an hour, longer than any one response runs."""


def hold(tenant: str, conversation_id: str, response_id: str, connection: Connection) -> bool | None:
    """Hold the conversation for ``response_id``; ``False`` while another response holds
    it, ``None`` if there is no such conversation."""
    now = now_ms()
    free = conversations.c.busy_response.is_(None) | (conversations.c.busy_since < now - STALE_HOLD_MS)
    taken = connection.execute(update(conversations).where(_mine(tenant, conversation_id) & free)
                               .values(busy_response=response_id, busy_since=now)).rowcount
    if taken:
        return True
    return None if _row(connection, tenant, conversation_id) is None else False


def release(tenant: str, conversation_id: str, response_id: str, connection: Connection) -> None:
    """Let go of the conversation, if ``response_id`` still holds it."""
    connection.execute(update(conversations).where(
        _mine(tenant, conversation_id) & (conversations.c.busy_response == response_id))
        .values(busy_response=None, busy_since=None))


def append_turn(turn: ConversationTurn, connection: Connection) -> None:
    """The turn's items appended and the hold released (the conversation gone meanwhile:
    nothing). An item whose id the conversation already holds (a client that sent back
    an item it had) is not added twice."""
    row = _row(connection, turn.tenant, turn.conversation_id, lock=True)
    if row is None:
        return
    ids = [item.get("id") for item in turn.items]
    held = set(connection.scalars(select(conversation_items.c.item_id).where(
        conversation_items.c.conversation_id == turn.conversation_id, conversation_items.c.item_id.in_(ids))))
    new, seen = [], set()
    for item in turn.items:
        if item.get("id") not in held and item.get("id") not in seen:
            seen.add(item.get("id"))
            new.append(item)
    if new:
        _append(connection, turn.conversation_id, row.next_position, new)
    release(turn.tenant, turn.conversation_id, turn.response_id, connection)


def with_turn(work: Callable[[Connection], bool], turn: ConversationTurn | None) -> Callable[[Connection], bool]:
    """``work`` (a response's end), and if it wrote, ``turn`` in the same transaction."""
    if turn is None:
        return work

    def both(connection: Connection) -> bool:
        written = work(connection)
        if written:
            append_turn(turn, connection)
        return written

    return both


class SqlConversations:
    """The conversations of one store, given its ways to write and read
    (:meth:`app.store.sql.SqlResponseStore.conversations`)."""

    def __init__(self, write: Run[Any], read: Run[Any]) -> None:
        self._write = write
        self._read = read

    async def create(self, tenant: str, conversation_id: str, metadata: JSON, items: Sequence[JSON]) -> JSON:
        return await self._write(lambda c: create(tenant, conversation_id, metadata, items, c))  # type: ignore[no-any-return]

    async def get(self, tenant: str, conversation_id: str) -> JSON | None:
        return await self._read(lambda c: get(tenant, conversation_id, c))  # type: ignore[no-any-return]

    async def set_metadata(self, tenant: str, conversation_id: str, metadata: JSON) -> JSON | None:
        return await self._write(lambda c: set_metadata(tenant, conversation_id, metadata, c))  # type: ignore[no-any-return]

    async def delete(self, tenant: str, conversation_id: str) -> bool:
        return await self._write(lambda c: remove(tenant, conversation_id, c))  # type: ignore[no-any-return]

    async def add(self, tenant: str, conversation_id: str, items: Sequence[JSON]) -> list[JSON] | None:
        return await self._write(lambda c: add(tenant, conversation_id, items, c))  # type: ignore[no-any-return]

    async def items(self, tenant: str, conversation_id: str, *, limit: int, order: Order,
                    after: str | None) -> ItemPage | None:
        return await self._read(lambda c: page(tenant, conversation_id, limit, order, after, c))  # type: ignore[no-any-return]

    async def item(self, tenant: str, conversation_id: str, item_id: str) -> tuple[bool, JSON | None]:
        return await self._read(lambda c: item(tenant, conversation_id, item_id, c))  # type: ignore[no-any-return]

    async def delete_item(self, tenant: str, conversation_id: str, item_id: str) -> tuple[JSON | None, bool]:
        return await self._write(lambda c: remove_item(tenant, conversation_id, item_id, c))  # type: ignore[no-any-return]

    async def history(self, tenant: str, conversation_id: str) -> list[JSON] | None:
        return await self._read(lambda c: history(tenant, conversation_id, c))  # type: ignore[no-any-return]

    async def hold(self, tenant: str, conversation_id: str, response_id: str) -> bool | None:
        return await self._write(lambda c: hold(tenant, conversation_id, response_id, c))  # type: ignore[no-any-return]

    async def release(self, tenant: str, conversation_id: str, response_id: str) -> None:
        await self._write(lambda c: release(tenant, conversation_id, response_id, c))
