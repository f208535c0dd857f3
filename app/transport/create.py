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
from app.engine.runs import LiveTurns
from app.engine.turn import Turn
from app.protocol.responses import ResponseResource
from app.protocol.states import ResponseStatus
from app.transport.deps import (
    DrainDep,
    EngineDep,
    LimiterDep,
    LiveDep,
    StreamOptionsDep,
    TenantDep,
    history_for,
    resource_json,
)
from app.transport.errors import client_left, error_response
from app.transport.sse import stream_emitted, stream_turn

router = APIRouter()


@router.post("/v1/responses")
async def create_response(request: Request, engine: EngineDep, tenant: TenantDep, live: LiveDep,
                          limiter: LimiterDep, drain: DrainDep, stream_options: StreamOptionsDep) -> Response:
    """Create a response: JSON by default, SSE with ``stream: true``; ``background: true``
    runs it in a task of its own and answers at once. The tenant's rate limits are
    checked first; the place it holds among the tenant's responses in flight is released
    when the response ends (its terminal event, the client leaving, an error before it
    started, or a background run's end)."""
    lease = await limiter.acquire(tenant)
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
    if body.background:
        live.start_background(turn, on_end=lease.release)
        # its first event exists once its start is recorded; a start that fails is a
        # plain HTTP error, as for any request
        await turn.wait_started()
        if body.stream:
            return stream_emitted(turn.follow(), stream_options)
        return resource_json(turn.response)
    if body.stream:
        try:
            await turn.open()  # a failure to begin is a plain error, before the stream commits
        except BaseException:
            await lease.release()
            raise
        return stream_turn(turn, drain, live, stream_options, on_end=lease.release)
    turn.defer_recording()  # nobody knows its id before the answer: one write, at the end
    turn.unread()  # and unstored, nobody reads its events
    async with lease:
        response = await _run_while_connected(request, turn, live)
    if response is None:  # the client left: nobody to answer
        return client_left()
    if response.status is ResponseStatus.FAILED and turn.error is not None:
        return error_response(turn.error)
    if turn.answer is not None:  # serialized once, for the store and for the client
        return Response(turn.answer, media_type="application/json")
    return resource_json(response)


WATCH_AFTER_SECONDS = 0.05
"""How long a JSON request runs before a task starts watching its connection: an answer
that is ready sooner makes no watcher task; a client that leaves sooner is noticed this
much later at most."""


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
