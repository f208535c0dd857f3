"""Server-sent events exactly as the spec frames them.

Each event is written as one ``event: <type>`` line and one ``data: <json>`` line,
``\\n`` line endings, in a single send; no ``id:``; the stream ends with ``data: [DONE]``.
Keep-alive pings are SSE comments, which clients ignore.

Races (see ARCHITECTURE.md):

* client gone: sse-starlette cancels the body generator; the turn's pump task is
  cancelled with it and closes the backend stream, stopping generation.
* upstream fails: the turn itself turns the failure into ``error`` + ``response.failed``.
* server shutdown: the app's :class:`~app.transport.drain.Drain` (or sse-starlette's
  own ``shutdown_event``) fires; the watcher interrupts the turn, whose events then end
  with ``response.failed``, and ``[DONE]`` follows, within the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from app.engine.runs import LiveTurns
from app.engine.turn import Emitted, Turn
from app.errors import ServerError
from app.transport.drain import Drain

PING_SECONDS = 15
SHUTDOWN_GRACE_SECONDS = 5.0
DONE_FRAME = b"data: [DONE]\n\n"


def encode_event(event_type: str, data: str) -> bytes:
    """One SSE block: the ``event`` line, one ``data`` line (JSON never holds a raw
    newline), and the blank line."""
    return f"event: {event_type}\ndata: {data}\n\n".encode()


def _response(body: AsyncIterator[bytes], shutdown: anyio.Event | None = None,
              background: BackgroundTask | None = None) -> EventSourceResponse:
    return EventSourceResponse(
        body,
        sep="\n",
        ping=PING_SECONDS,
        ping_message_factory=lambda: ServerSentEvent(comment="ping", sep="\n"),
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        shutdown_event=shutdown,
        shutdown_grace_period=SHUTDOWN_GRACE_SECONDS if shutdown is not None else 0,
        background=background,
    )


def stream_turn(turn: Turn, drain: Drain, live: LiveTurns,
                on_end: Callable[[], Awaitable[None]] | None = None) -> EventSourceResponse:
    """The SSE response that drives a prepared turn. ``on_end`` (idempotent) is awaited
    once the turn has ended, before ``[DONE]``, and in any case when the response is
    over, also if its body never started."""
    shutdown = anyio.Event()

    async def ended() -> None:
        await turn.discard()  # opened, but the body never ran: the client left first
        if on_end is not None:
            await on_end()

    async def body() -> AsyncIterator[bytes]:
        watcher = asyncio.create_task(_interrupt_on_shutdown(turn, shutdown, drain))
        try:
            async with contextlib.aclosing(live.tracked_batches(turn)) as batches:
                async for batch in batches:  # one send per batch
                    yield b"".join([encode_event(emitted.type, emitted.data) for emitted in batch])
            await ended()
            yield DONE_FRAME
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await ended()

    return _response(body(), shutdown, BackgroundTask(ended))


def stream_emitted(events: AsyncIterator[Emitted]) -> EventSourceResponse:
    """An SSE response following events produced elsewhere (a background run): the
    listener going away does not stop the run."""

    async def body() -> AsyncIterator[bytes]:
        async for emitted in events:
            yield encode_event(emitted.type, emitted.data)
        yield DONE_FRAME

    return _response(body())


def replay_events(events: Sequence[str], starting_after: int | None) -> EventSourceResponse:
    """Stored events of a finished response, after sequence number ``starting_after``."""

    async def body() -> AsyncIterator[bytes]:
        for data in events:
            event = json.loads(data)
            if starting_after is None or event["sequence_number"] > starting_after:
                yield encode_event(event["type"], data)
        yield DONE_FRAME

    return _response(body())


async def _interrupt_on_shutdown(turn: Turn, shutdown: anyio.Event, drain: Drain) -> None:
    """Interrupt the turn when the app drains or sse-starlette sees uvicorn stopping."""
    async with anyio.create_task_group() as group:

        async def on_drain() -> None:
            await drain.wait()
            group.cancel_scope.cancel()

        group.start_soon(on_drain)
        await shutdown.wait()
        group.cancel_scope.cancel()
    turn.interrupt(ServerError("The server is shutting down.", code="server_shutting_down"))
