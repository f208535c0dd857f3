"""HTTP routes: ``POST /v1/responses`` (JSON and SSE), the response lifecycle endpoints
that OpenAI's SDKs call (a superset of the spec), models, health."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from app import jsontext
from app.engine.body_decoding import decode_body
from app.engine.engine import Engine
from app.engine.history import HistorySource, NoHistory, StoredHistory
from app.engine.runs import LiveTurns
from app.engine.turn import Emitted, Turn
from app.errors import InvalidRequest, NotFound, ORSError, StoreUnavailable
from app.protocol.responses import ResponseResource
from app.store.base import ResponseStore
from app.transport.auth import KeyAuthenticator
from app.transport.errors import client_left, error_response
from app.transport.ratelimit import RateLimiter
from app.transport.sse import replay_events, stream_emitted, stream_turn

log = logging.getLogger("ors.http")


# Dependencies are coroutines: FastAPI runs a plain function dependency in a worker
# thread, a hop off the event loop for a dictionary lookup.
async def get_engine(request: Request) -> Engine:
    return request.app.state.engine  # type: ignore[no-any-return]


async def get_tenant(request: Request) -> str:
    authenticator: KeyAuthenticator = request.app.state.authenticator
    # without keys no header is read: reading one makes the request's header map (about
    # 1% of a proxied request's instructions)
    return authenticator.tenant(request.headers.get("authorization") if authenticator.keyed else None)


async def get_live(request: Request) -> LiveTurns:
    return request.app.state.live  # type: ignore[no-any-return]


async def get_limiter(request: Request) -> RateLimiter:
    return request.app.state.limiter  # type: ignore[no-any-return]


EngineDep = Annotated[Engine, Depends(get_engine)]
TenantDep = Annotated[str, Depends(get_tenant)]
LiveDep = Annotated[LiveTurns, Depends(get_live)]
LimiterDep = Annotated[RateLimiter, Depends(get_limiter)]

router = APIRouter()


@router.get("/healthz", include_in_schema=False)
async def healthz(request: Request) -> JSONResponse:
    """200 once the server can serve (models loaded, store open)."""
    if not getattr(request.app.state, "ready", False):
        return JSONResponse({"status": "starting"}, status_code=503)
    return JSONResponse({"status": "ok"})


READY_TIMEOUT_SECONDS = 2.0
"""How long ``/readyz`` waits for the store's answer before it calls it out of reach."""


@router.get("/readyz", include_in_schema=False)
async def readyz(request: Request) -> JSONResponse:
    """Readiness, for a load balancer or an orchestrator's probe: 200 while this server
    can serve now, 503 while it starts, stops, or has an embedded model whose server is
    being started again (another replica serves that model meanwhile). The body names each
    check's state and nothing more (no error text: the probe needs no key).

    The store is checked (one query, :data:`READY_TIMEOUT_SECONDS`) and reported, and an
    unreachable one makes the status ``degraded``, still 200: every replica shares the
    database, so its outage would take them all out of the balancer at once, while
    ``store: false`` requests (Codex sends those) are still served and the others get a
    precise ``503 store_unavailable``. ``/healthz`` stays the liveness probe."""
    state = request.app.state
    engine: Engine = state.engine
    checks: dict[str, Any] = {"server": "stopping" if state.drain.draining
                              else "ok" if getattr(state, "ready", False) else "starting"}
    if checks["server"] == "ok" and engine.store is not None:
        try:
            async with asyncio.timeout(READY_TIMEOUT_SECONDS):
                await engine.store.ping()
            checks["store"] = "ok"
        except (StoreUnavailable, TimeoutError):
            checks["store"] = "unreachable"
    models = {gauges.model: "ok" if gauges.up else "restarting"
              for backend in getattr(state, "backends", ()) for gauges in backend.gauges()}
    if models:
        checks["models"] = models
    if checks["server"] != "ok" or any(value != "ok" for value in models.values()):
        return JSONResponse({"status": "not_ready", **checks}, status_code=503)
    return JSONResponse({"status": "ready" if checks.get("store") == "ok" else "degraded", **checks})


@router.get("/v1/models")
async def list_models(engine: EngineDep, _: TenantDep) -> dict[str, Any]:
    """The models this server serves, in the OpenAI list shape."""
    return {
        "object": "list",
        "data": [
            {"id": info.id, "object": "model", "created": 0, "owned_by": info.owned_by,
             "context_window": info.context_window}
            for info in await engine.router.available_models()
        ],
    }


def history_for(engine: Engine, tenant: str) -> HistorySource:
    return StoredHistory(engine.store, tenant, engine.history_cache) if engine.store is not None else NoHistory()


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    """Create a response: JSON by default, SSE with ``stream: true``; ``background: true``
    runs it in a task of its own and answers at once. The tenant's rate limits are
    checked first; the place it holds among the tenant's responses in flight is released
    when the response ends (its terminal event, the client leaving, an error before it
    started, or a background run's end).

    The hot path: what the other routes get as FastAPI dependencies is read here from
    the app's state directly (resolving four dependencies cost about as much as the
    rest of the route's own work)."""
    state = request.app.state
    engine: Engine = state.engine
    live: LiveTurns = state.live
    tenant = await get_tenant(request)
    lease = await state.limiter.acquire(tenant)
    try:
        turn = await engine.prepare(
            await decode_body(await request.body(), engine.limits),
            tenant=tenant,
            history=history_for(engine, tenant),
            whole_unless_streamed=True,  # a plain JSON answer: nobody sees its output before it ends
        )
    except BaseException:
        await lease.release()
        raise
    body = turn.body
    drain = state.drain
    if body.background:
        live.start_background(turn, on_end=lease.release)
        # its first event exists once its start is recorded; a start that fails is a
        # plain HTTP error, as for any request
        await turn.wait_started()
        if body.stream:
            return stream_emitted(turn.follow())
        return _json(turn.response)
    if body.stream:
        try:
            await turn.open()  # a failure to begin is a plain error, before the stream commits
        except BaseException:
            await lease.release()
            raise
        return stream_turn(turn, drain, live, on_end=lease.release)
    turn.defer_recording()  # nobody knows its id before the answer: one write, at the end
    turn.unread()  # and unstored, nobody reads its events
    async with lease:
        response = await _run_while_connected(request, turn, live)
    if response is None:  # the client left: nobody to answer
        return client_left()
    if response.status == "failed" and turn.error is not None:
        return error_response(turn.error)
    if turn.answer is not None:  # serialized once, for the store and for the client
        return Response(turn.answer, media_type="application/json")
    return _json(response)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(
    response_id: str,
    engine: EngineDep,
    tenant: TenantDep,
    live: LiveDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=-1)] = None,
) -> Response:
    """A stored response; with ``stream=true``, its events (after ``starting_after``)
    replayed, following live ones while it still runs, in this process or in another
    that shares the store (``app.store.relay``)."""
    running = live.get(tenant, response_id)
    if running is not None:
        return stream_emitted(running.follow(starting_after)) if stream else _json(running.response)
    stored = await _store(engine).get(tenant, response_id)
    if stored is None:
        raise _not_found(response_id)
    if not stream:
        return Response(_dumps(stored.resource), media_type="application/json")
    if stored.status in ("queued", "in_progress"):
        elsewhere = _store(engine).follow_elsewhere(tenant, response_id, starting_after)
        if elsewhere is not None:  # another process runs it: follow it there
            return stream_emitted(Emitted(event.type, event.data) async for event in elsewhere)
    events = await _store(engine).events(tenant, response_id)
    if events is None:
        raise InvalidRequest(
            f"Response '{response_id}' has no stored events to replay: it was answered as plain "
            "JSON (only streamed and background responses keep their events), it is still running "
            "on another server instance, or it was interrupted.",
            code="events_unavailable",
            param="stream",
        )
    return replay_events(events, starting_after)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, engine: EngineDep, tenant: TenantDep, live: LiveDep) -> Response:
    running = live.get(tenant, response_id)
    if running is not None:
        running.cancel()
        await running.wait_ended()
    if not await _store(engine).delete(tenant, response_id):
        raise _not_found(response_id)
    return Response(_dumps({"id": response_id, "object": "response.deleted", "deleted": True}),
                    media_type="application/json")


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, engine: EngineDep, tenant: TenantDep, live: LiveDep) -> Response:
    """Cancel a background response, wherever it runs; a finished one is returned
    unchanged. Running here, the turn is stopped and its own end (with the output made so
    far) is the answer; running on another replica (or nowhere any more), the cancel is
    recorded in the store, which tells the replica that runs it (``app.store.cancels``)."""
    running = live.get(tenant, response_id)
    if running is not None:
        if not running.body.background:
            raise _not_background()
        running.cancel()
        await running.wait_ended()
        return _json(running.response)
    store = _store(engine)
    stored = await store.get(tenant, response_id)
    if stored is None:
        raise _not_found(response_id)
    if not stored.background:
        raise _not_background()
    if stored.status in ("queued", "in_progress"):
        stored = await store.cancel(tenant, response_id)
        if stored is None:  # deleted meanwhile
            raise _not_found(response_id)
    return Response(_dumps(stored.resource), media_type="application/json")


def _not_background() -> InvalidRequest:
    return InvalidRequest("Only background responses can be cancelled.", code="not_background", param="response_id")


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    engine: EngineDep,
    tenant: TenantDep,
    limit: int = 20,
    order: str = "desc",
    after: str | None = None,
) -> Response:
    """The response's input items, newest first by default, with cursor pagination."""
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100.", code="invalid_value", param="limit")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'.", code="invalid_value", param="order")
    direction: Literal["asc", "desc"] = "asc" if order == "asc" else "desc"
    page = await _store(engine).input_items(tenant, response_id, limit=limit, order=direction, after=after)
    if page is None:
        raise _not_found(response_id)
    data = page.data
    return Response(
        _dumps({
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": page.has_more,
        }),
        media_type="application/json",
    )


def _store(engine: Engine) -> ResponseStore:
    if engine.store is None:
        raise NotFound("This server stores no responses.", code="not_found")
    return engine.store


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", code="response_not_found", param="response_id")


def _dumps(value: Any) -> str:
    return jsontext.dumps(value)


def _json(response: ResponseResource) -> Response:
    return Response(response.model_dump_json(), media_type="application/json")


WATCH_AFTER_SECONDS = 0.05
"""How long a JSON request runs before a task starts watching its connection. Most
answers in front of a fast upstream take a millisecond or two: for those no watcher
task is made, started, cancelled and awaited (a few percent of such a request). A client
that leaves sooner is noticed this much later at most."""


async def _run_while_connected(request: Request, turn: Turn, live: LiveTurns) -> ResponseResource | None:
    """Run a non-streaming turn in this task; ``None`` if the client disconnected first.

    A watcher task beside it (started once the turn has run :data:`WATCH_AFTER_SECONDS`)
    reads the connection: on ``http.disconnect`` it cancels this task (a plain
    ``Task.cancel``, delivered once), so the turn ends as a client leaving ends one (its
    clean-up, recording the end, runs to its end), and the cancel is taken back
    (``Task.uncancel``): the request ends normally, not as an error. A cancel from
    anywhere else goes on up."""
    current = asyncio.current_task()
    assert current is not None
    running = True
    left = False
    watcher: asyncio.Task[None] | None = None

    async def watch_disconnect() -> None:
        nonlocal left
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                if running:
                    left = True
                    current.cancel()
                return

    def start_watching() -> None:
        nonlocal watcher
        if running:
            watcher = asyncio.create_task(watch_disconnect())

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_SECONDS, start_watching)
    try:
        with live.tracking(turn):
            return await turn.run()
    except asyncio.CancelledError:
        if not left or current.uncancel() > 0:
            raise
        return None
    finally:
        running = False
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


class CreateResponseRoute:
    """``POST /v1/responses`` straight to :func:`create_response`, past the framework's
    router and its per-request layers (exception middleware, exit stacks, dependency
    solving, route matching): the one route whose cost is the product's, in front of a
    fast upstream. A pure ASGI middleware, the innermost one, so the guards, request ids
    and metrics around it see the request as they see any other; the route stays
    registered with FastAPI too (the OpenAPI document, and nothing else reaches it).

    An :class:`ORSError` leaves as the spec's error object through the one mapping
    (:func:`error_response`), as the exception handlers send it; anything else goes on
    to the outermost handler, which logs it and answers 500 with the error object."""

    def __init__(self, app: ASGIApp, route: BaseRoute) -> None:
        self.app = app
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/responses" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route  # what the metrics label the request with
        request = Request(scope, receive, send)
        try:
            response = await create_response(request)
        except ORSError as exc:
            response = error_response(exc)
        except ClientDisconnect:  # gone while sending its body
            response = client_left()
        await response(scope, receive, send)


def install_routes(app: FastAPI) -> None:
    from app.transport.compact import router as compact_router
    from app.transport.input_tokens import router as input_tokens_router
    from app.transport.websocket import router as websocket_router

    app.include_router(router)
    app.include_router(compact_router)
    app.include_router(input_tokens_router)
    app.include_router(websocket_router)
    route = next(route for route in router.routes
                 if getattr(route, "path", None) == "/v1/responses" and "POST" in getattr(route, "methods", ()))
    app.add_middleware(CreateResponseRoute, route=route)  # added first: the innermost

