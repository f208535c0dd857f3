"""OpenAI's Conversations API (a superset of the spec), per tenant, in the response
store: ``POST /v1/conversations`` (initial items, metadata), ``GET``, ``POST`` (its
metadata) and ``DELETE /v1/conversations/{id}``; its items: ``GET`` a page (cursor
``after``, ``order``, as ``input_items``), ``POST`` to add up to 20, ``GET`` and ``DELETE``
one. Items are checked as ``POST /v1/responses`` checks input items (images and files
too), and stored with ids (:mod:`app.store.conversations`). Another tenant's
conversation is absent: 404."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app import jsontext
from app.engine import ids
from app.engine.engine import Engine
from app.engine.files import check_files
from app.engine.images import check_images
from app.engine.items import stored_form
from app.engine.validation import decode_json, parse_body
from app.errors import InvalidRequest, NotFound
from app.protocol.conversations import AddItemsBody, CreateConversationBody, UpdateConversationBody
from app.protocol.items import CompactionTriggerParam, ExtensionItemParam
from app.store.conversations import SqlConversations
from app.transport.deps import Cursor, EngineDep, IdPath, TenantDep
from app.transport.lifecycle import page_json, paging

router = APIRouter(prefix="/v1/conversations")


@router.post("")
async def create_conversation(request: Request, engine: EngineDep, tenant: TenantDep) -> Response:
    body = parse_body(CreateConversationBody, decode_json(await request.body()))
    items = await _stored_items(engine, body.items or [])
    return _json(await _conversations(engine).create(tenant, ids.new_id("conv"), body.metadata or {}, items))


@router.get("/{conversation_id}")
async def get_conversation(conversation_id: IdPath, engine: EngineDep, tenant: TenantDep) -> Response:
    found = await _conversations(engine).get(tenant, conversation_id)
    if found is None:
        raise _not_found(conversation_id)
    return _json(found)


@router.post("/{conversation_id}")
async def update_conversation(conversation_id: IdPath, request: Request, engine: EngineDep,
                              tenant: TenantDep) -> Response:
    body = parse_body(UpdateConversationBody, decode_json(await request.body()))
    updated = await _conversations(engine).set_metadata(tenant, conversation_id, body.metadata)
    if updated is None:
        raise _not_found(conversation_id)
    return _json(updated)


@router.delete("/{conversation_id}")
async def delete_conversation(conversation_id: IdPath, engine: EngineDep, tenant: TenantDep) -> Response:
    if not await _conversations(engine).delete(tenant, conversation_id):
        raise _not_found(conversation_id)
    return _json({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


@router.get("/{conversation_id}/items")
async def list_items(conversation_id: IdPath, engine: EngineDep, tenant: TenantDep, limit: int = 20,
                     order: str = "desc", after: Cursor = None) -> Response:
    """The conversation's items, newest first by default, with the cursor rules of
    ``input_items``."""
    size, direction = paging(limit, order)
    page = await _conversations(engine).items(tenant, conversation_id, limit=size, order=direction, after=after)
    if page is None:
        raise _not_found(conversation_id)
    return page_json(page.data, page.has_more)


@router.post("/{conversation_id}/items")
async def add_items(conversation_id: IdPath, request: Request, engine: EngineDep, tenant: TenantDep) -> Response:
    body = parse_body(AddItemsBody, decode_json(await request.body()))
    added = await _conversations(engine).add(tenant, conversation_id, await _stored_items(engine, body.items))
    if added is None:
        raise _not_found(conversation_id)
    return page_json(added, False)


@router.get("/{conversation_id}/items/{item_id}")
async def get_item(conversation_id: IdPath, item_id: IdPath, engine: EngineDep, tenant: TenantDep) -> Response:
    exists, item = await _conversations(engine).item(tenant, conversation_id, item_id)
    if not exists:
        raise _not_found(conversation_id)
    if item is None:
        raise _item_not_found(item_id)
    return _json(item)


@router.delete("/{conversation_id}/items/{item_id}")
async def delete_item(conversation_id: IdPath, item_id: IdPath, engine: EngineDep, tenant: TenantDep) -> Response:
    """Remove one item; the conversation, as OpenAI answers it."""
    conversation, removed = await _conversations(engine).delete_item(tenant, conversation_id, item_id)
    if conversation is None:
        raise _not_found(conversation_id)
    if not removed:
        raise _item_not_found(item_id)
    return _json(conversation)


async def _stored_items(engine: Engine, items: list[Any]) -> list[dict[str, Any]]:
    """The items as a conversation keeps them (ids given), checked as input items are."""
    for index, item in enumerate(items):
        if isinstance(item, CompactionTriggerParam | ExtensionItemParam):
            raise InvalidRequest(f"A conversation cannot hold an item of type '{item.type}'.",
                                 code="invalid_type", param=f"items[{index}].type")
    try:
        await check_images(items, max_bytes=engine.max_image_bytes)
        await check_files(items, engine.file_limits)
    except InvalidRequest as refused:  # the checks name the request's ``input``: here it is ``items``
        if refused.param is not None and refused.param.startswith("input"):
            refused.param = "items" + refused.param[len("input"):]
        raise
    return [stored_form(item) for item in items]


def _conversations(engine: Engine) -> SqlConversations:
    if engine.store is None:
        raise NotFound("This server stores nothing, so it keeps no conversations.", code="not_found")
    return engine.store.conversations


def _not_found(conversation_id: str) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id}' not found.", code="conversation_not_found",
                    param="conversation_id")


def _item_not_found(item_id: str) -> NotFound:
    return NotFound(f"Item with id '{item_id}' not found in this conversation.", code="item_not_found",
                    param="item_id")


def _json(value: Any) -> Response:
    return Response(jsontext.dumps(value), media_type="application/json")
