"""The store's reads: plain functions of a connection and plain values, each run in one
read transaction (:meth:`app.store.database.Database.read`), so it sees one snapshot.

The statements read by id and the chain are built once, with bound parameters (``b_id``,
``b_tenant``): SQLAlchemy compiles each once and reuses the compiled form, where a
recursive query built per call would cost more Python than running it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    CTE,
    ColumnElement,
    CompoundSelect,
    Integer,
    Row,
    Text,
    bindparam,
    cast,
    func,
    literal_column,
    null,
    select,
    union_all,
)
from sqlalchemy.engine import Connection

from app.protocol.states import ResponseStatus
from app.store.base import JSON, ChainLink, ItemPage, Order, StoredResponse
from app.store.schema import JsonText, items, responses
from app.store.schema import events as event_rows

MAX_CHAIN_DEPTH = 1_000_000
"""A guard against a cycle, which the write path cannot create."""

STORED_COLUMNS = (
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
"""What a :class:`~app.store.base.StoredResponse` is made of (:func:`stored_response`)."""

BY_ID = (responses.c.id == bindparam("b_id")) & (responses.c.tenant == bindparam("b_tenant"))
"""The response ``b_id`` of tenant ``b_tenant``, visible or not."""


def stored_response(
    row: Row[*tuple[Any, ...]], *, status: str | None = None, resource: JSON | None = None
) -> StoredResponse:
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


def visible_where(tenant: str, response_id: str) -> ColumnElement[bool]:
    return (responses.c.id == response_id) & (responses.c.tenant == tenant) & responses.c.deleted_at.is_(None)


def ancestry_cte(*, visible_start: bool, through_deleted_only: bool = False) -> CTE:
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
    ancestry = ancestry_cte(visible_start=True)
    links = select(
        ancestry.c.depth, ancestry.c.id.label("response_id"), responses.c.tools,
        cast(null(), Text).label("role"), cast(null(), Integer).label("position"), cast(null(), JsonText).label("item"),
    ).join(responses, responses.c.id == ancestry.c.id)
    own_items = select(
        cast(null(), Integer), items.c.response_id, cast(null(), JsonText), items.c.role, items.c.position,
        items.c.item,
    ).where(items.c.response_id.in_(select(ancestry.c.id)))
    return union_all(links, own_items).order_by(literal_column("position"))


GET_RESPONSE = select(*STORED_COLUMNS).where(BY_ID & responses.c.deleted_at.is_(None))
EVENTS_OF = (select(event_rows.c.body).join(responses, responses.c.id == event_rows.c.response_id)
             .where(BY_ID & responses.c.deleted_at.is_(None)))
CHAIN = _chain_query()
"""A visible response's chain in one statement: a row per link (``depth``: 0 for the
response, up to its oldest ancestor; its ``tools``) and a row per item of any link
(``depth`` NULL; ``role``, ``item``), items in ``position`` order. No row: the response
is not visible. One statement is one snapshot, and the ancestry is walked once."""


def _by_id(tenant: str, response_id: str) -> dict[str, str]:
    return {"b_tenant": tenant, "b_id": response_id}


def get_response(tenant: str, response_id: str, connection: Connection) -> StoredResponse | None:
    row = connection.execute(GET_RESPONSE, _by_id(tenant, response_id)).first()
    return None if row is None else stored_response(row)


def events_body(tenant: str, response_id: str, connection: Connection) -> bytes | None:
    """The stored body of a visible response's events (:mod:`app.store.codec`)."""
    return connection.scalar(EVENTS_OF, _by_id(tenant, response_id))  # type: ignore[no-any-return]


def chain_links(tenant: str, response_id: str, connection: Connection) -> list[ChainLink] | None:
    """The chain ending at a visible response, oldest first, each link with its own
    items (:data:`CHAIN`: one statement whatever the depth)."""
    rows = connection.execute(CHAIN, _by_id(tenant, response_id)).all()
    links = sorted((row for row in rows if row.depth is not None), key=lambda row: row.depth, reverse=True)
    if not links:
        return None
    own: dict[str, tuple[list[JSON], list[JSON]]] = {link.response_id: ([], []) for link in links}
    for row in rows:  # items in position order (links have none)
        if row.depth is None:
            inputs, outputs = own[row.response_id]
            (inputs if row.role == "input" else outputs).append(row.item)
    return [
        ChainLink(response_id=link.response_id, tools=link.tools, input_items=own[link.response_id][0],
                  output_items=own[link.response_id][1])
        for link in links
    ]


def input_items_page(tenant: str, response_id: str, limit: int, order: Order, after: str | None,
                     connection: Connection) -> ItemPage | None:
    """Up to ``limit`` of a visible response's input items after the cursor ``after`` (an
    item id; one that is not among them gives an empty page), in ``order`` (``desc`` walks
    the original order backwards)."""
    ascending = order == "asc"
    own_inputs = (items.c.response_id == response_id) & (items.c.role == "input")
    query = select(items.c.item).where(own_inputs)
    if after is not None:
        cursor = select(func.min(items.c.position)).where(own_inputs, items.c.item_id == after).scalar_subquery()
        query = query.where(items.c.position > cursor if ascending else items.c.position < cursor)
    query = query.order_by(items.c.position.asc() if ascending else items.c.position.desc()).limit(limit + 1)
    if connection.scalar(select(responses.c.id).where(visible_where(tenant, response_id))) is None:
        return None
    page: Sequence[JSON] = connection.scalars(query).all()
    return ItemPage(data=list(page[:limit]), has_more=len(page) > limit)


def responses_page(tenant: str, limit: int, order: Order, after: str | None,
                   connection: Connection) -> ItemPage:
    """Up to ``limit`` of the tenant's visible responses (their resources) after the
    cursor ``after`` (a response id; one that is not among them gives an empty page), in
    ``order`` of creation: ids begin with the time they were made (:mod:`app.engine.ids`),
    so the primary key is the order, ``desc`` newest first."""
    ascending = order == "asc"
    mine = (responses.c.tenant == tenant) & responses.c.deleted_at.is_(None)
    query = select(responses.c.resource).where(mine)
    if after is not None:
        if connection.scalar(select(responses.c.id).where(mine, responses.c.id == after)) is None:
            return ItemPage(data=[], has_more=False)
        query = query.where(responses.c.id > after if ascending else responses.c.id < after)
    query = query.order_by(responses.c.id.asc() if ascending else responses.c.id.desc()).limit(limit + 1)
    page: Sequence[JSON] = connection.scalars(query).all()
    return ItemPage(data=list(page[:limit]), has_more=len(page) > limit)


def unfinished_owners(instance_id: str, connection: Connection) -> list[str]:
    """The other instances that own responses not finished (recovery's candidates)."""
    query = (
        select(responses.c.owner)
        .where(responses.c.finished_at.is_(None), responses.c.owner != instance_id)
        .distinct()
    )
    return list(connection.scalars(query))


def cancelled_since(owner: str, since_ms: int, connection: Connection) -> list[tuple[str, str]]:
    """``(tenant, id)`` of ``owner``'s responses cancelled since ``since_ms``."""
    query = select(responses.c.tenant, responses.c.id).where(
        responses.c.owner == owner,
        responses.c.status == ResponseStatus.CANCELLED,
        responses.c.updated_at >= since_ms,
    )
    return [(row.tenant, row.id) for row in connection.execute(query)]
