"""The lifecycle of a stored response: retrieve (as JSON, or its events replayed and
followed), delete, cancel, list its input items. OpenAI's SDKs call these; they are a
superset of the spec."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from app import jsontext
from app.engine.engine import Engine
from app.engine.event_log import Emitted
from app.errors import InvalidRequest, NotFound
from app.protocol.states import ResponseStatus
from app.store.base import ResponseStore
from app.transport.deps import Cursor, EngineDep, IdPath, LiveDep, StreamOptionsDep, TenantDep, resource_json
from app.transport.sse import replay_events, stream_emitted

router = APIRouter()


@router.get("/v1/responses/{response_id}")
async def retrieve_response(
    response_id: IdPath,
    engine: EngineDep,
    tenant: TenantDep,
    live: LiveDep,
    stream_options: StreamOptionsDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=-1)] = None,
) -> Response:
    """A stored response; with ``stream=true``, its events (after ``starting_after``)
    replayed, following live ones while it still runs, in this process or in another
    that shares the store (``app.store.relay``)."""
    running = live.get(tenant, response_id)
    if running is not None:
        if stream:
            return stream_emitted(running.follow(starting_after), stream_options)
        return resource_json(running.response)
    stored = await _store(engine).get(tenant, response_id)
    if stored is None:
        raise _not_found(response_id)
    if not stream:
        return _json(stored.resource)
    if not ResponseStatus(stored.status).final:
        elsewhere = _store(engine).follow_elsewhere(tenant, response_id, starting_after)
        if elsewhere is not None:  # another process runs it: follow it there
            return stream_emitted((Emitted(event.type, event.data) async for event in elsewhere), stream_options)
    events = await _store(engine).events(tenant, response_id)
    if events is None:
        raise InvalidRequest(
            f"Response '{response_id}' has no stored events to replay: it was answered as plain "
            "JSON (only streamed and background responses keep their events), it is still running "
            "on another server instance, or it was interrupted.",
            code="events_unavailable",
            param="stream",
        )
    return replay_events(events, starting_after, stream_options)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: IdPath, engine: EngineDep, tenant: TenantDep, live: LiveDep) -> Response:
    running = live.get(tenant, response_id)
    if running is not None:
        running.cancel()
        await running.wait_ended()
    if not await _store(engine).delete(tenant, response_id):
        raise _not_found(response_id)
    return _json({"id": response_id, "object": "response.deleted", "deleted": True})


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: IdPath, engine: EngineDep, tenant: TenantDep, live: LiveDep) -> Response:
    """Cancel a background response, wherever it runs; a finished one is returned
    unchanged. Running here, the run is stopped and its own end (with the output made so
    far) is the answer; running on another replica (or nowhere any more), the cancel is
    recorded in the store, which tells the replica that runs it (``app.store.cancels``)."""
    running = live.get(tenant, response_id)
    if running is not None:
        if not running.body.background:
            raise _not_background()
        running.cancel()
        await running.wait_ended()
        return resource_json(running.response)
    store = _store(engine)
    stored = await store.get(tenant, response_id)
    if stored is None:
        raise _not_found(response_id)
    if not stored.background:
        raise _not_background()
    if not ResponseStatus(stored.status).final:
        stored = await store.cancel(tenant, response_id)
        if stored is None:  # deleted meanwhile
            raise _not_found(response_id)
    return _json(stored.resource)


@router.get("/v1/responses")
async def list_responses(
    engine: EngineDep,
    tenant: TenantDep,
    limit: int = 20,
    order: str = "desc",
    after: Cursor = None,
) -> Response:
    """The tenant's stored responses, newest first by default, with the cursor rules of
    ``input_items`` (a superset of the spec, for the playground and for operators). A
    WebSocket upgrade on this path is the WebSocket transport (``app.transport.websocket``)."""
    size, direction = paging(limit, order)
    page = await _store(engine).responses(tenant, limit=size, order=direction, after=after)
    return page_json(page.data, page.has_more)


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    response_id: IdPath,
    engine: EngineDep,
    tenant: TenantDep,
    limit: int = 20,
    order: str = "desc",
    after: Cursor = None,
) -> Response:
    """The response's input items, newest first by default, with cursor pagination."""
    size, direction = paging(limit, order)
    page = await _store(engine).input_items(tenant, response_id, limit=size, order=direction, after=after)
    if page is None:
        raise _not_found(response_id)
    return page_json(page.data, page.has_more)


def paging(limit: int, order: str) -> tuple[int, Literal["asc", "desc"]]:
    """A list's ``limit`` (1 to 100) and ``order`` (``asc`` or ``desc``), checked."""
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100.", code="invalid_value", param="limit")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'.", code="invalid_value", param="order")
    return limit, "asc" if order == "asc" else "desc"


def page_json(data: list[Any], has_more: bool) -> Response:
    """A list page as OpenAI's API gives one."""
    return _json({
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    })


def _store(engine: Engine) -> ResponseStore:
    if engine.store is None:
        raise NotFound("This server stores no responses.", code="not_found")
    return engine.store


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", code="response_not_found", param="response_id")


def _not_background() -> InvalidRequest:
    return InvalidRequest("Only background responses can be cancelled.", code="not_background", param="response_id")


def _json(value: Any) -> Response:
    return Response(jsontext.dumps(value), media_type="application/json")
