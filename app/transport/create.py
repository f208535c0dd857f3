"""``POST /v1/responses``: a response answered as JSON, streamed as SSE, or run in the
background.

Errors before the answer starts (a bad body, a refused rate limit, a model that cannot
start) leave as the spec's error object through the app's exception handlers
(:mod:`app.transport.errors`); once a stream has started, failures are its events.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.engine.body_decoding import decode_body
from app.engine.delivery import Delivery
from app.engine.run import Run
from app.protocol.responses import ResponseResource
from app.protocol.states import ResponseStatus
from app.transport.deps import (
    DrainDep,
    EngineDep,
    LimiterDep,
    StreamOptionsDep,
    TenantDep,
    history_for,
    resource_json,
)
from app.transport.errors import client_left, error_response
from app.transport.sse import stream_emitted, stream_run

router = APIRouter()


@router.post("/v1/responses")
async def create_response(request: Request, engine: EngineDep, tenant: TenantDep, limiter: LimiterDep,
                          drain: DrainDep, stream_options: StreamOptionsDep) -> Response:
    """Create a response: JSON by default, SSE with ``stream: true``; ``background: true``
    runs it in a task of its own and answers at once. The tenant's rate limits are
    checked first; the place it holds among the tenant's responses in flight is released
    when the response ends (the run awaits it once, however it ends), or when the request
    fails before a run exists."""
    lease = await limiter.acquire(tenant)
    try:
        prepared = await engine.prepare(await decode_body(await request.body(), engine.limits), tenant=tenant,
                                        history=history_for(engine, tenant))
    except BaseException:
        await lease.release()
        raise
    body = prepared.body
    delivery = Delivery.BACKGROUND if body.background else Delivery.SSE if body.stream else Delivery.JSON
    # a start that cannot be recorded raises here: a plain HTTP error, before any stream
    run = await engine.run(prepared, delivery, on_end=lease.release)
    if delivery is Delivery.BACKGROUND:
        if body.stream:
            return stream_emitted(run.follow(), stream_options)
        return resource_json(run.response)
    if delivery is Delivery.SSE:
        return stream_run(run, drain, stream_options)
    response = await _run_while_connected(request, run)
    if response is None:  # the client left: nobody to answer
        return client_left()
    if response.status == ResponseStatus.FAILED and run.error is not None:
        return error_response(run.error)
    if run.answer is not None:  # serialized once, for the store and for the client
        return Response(run.answer, media_type="application/json")
    return resource_json(response)


WATCH_AFTER_SECONDS = 0.05
"""How long a JSON request runs before a task starts watching its connection: an answer
that is ready sooner makes no watcher task; a client that leaves sooner is noticed this
much later at most."""


async def _run_while_connected(request: Request, run: Run) -> ResponseResource | None:
    """Drive a JSON run in this task; ``None`` if the client disconnected first.

    A watcher task beside it (started once the run has run :data:`WATCH_AFTER_SECONDS`)
    reads the connection: on ``http.disconnect`` it cancels this task (a plain
    ``Task.cancel``, delivered once), so the run ends as a reader leaving ends one (its
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
        return await run.final()
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
