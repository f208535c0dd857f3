"""Server-sent events, through sse-starlette's ``EventSourceResponse``.

What a client receives: each event as one ``event: <type>`` line and one ``data: <json>``
line, ``\\n`` line endings, no ``id:``; the events of one batch of the run in one write;
keep-alive pings as SSE comments (``: ping``) after ``ORS_SSE_PING_SECONDS`` of silence;
the stream ends with ``data: [DONE]``. Headers: ``Content-Type: text/event-stream;
charset=utf-8``, ``Cache-Control: no-store``, ``X-Accel-Buffering: no`` (nginx passes the
stream on unbuffered); no ``Connection`` header, whose value is the HTTP layer's choice.

The races of a stream that reads a run (:func:`stream_run`):

* **client gone**: sse-starlette's listener sees ``http.disconnect`` and cancels the
  response's task group; the body is cancelled where it waits, inside the run, whose own
  shielded clean-up stops the backend (generation stops) and records the response
  ``incomplete`` (``client_disconnected``).
* **upstream fails**: the run itself turns the failure into ``error`` +
  ``response.failed``; ``[DONE]`` follows.
* **server shutdown**: the app's :class:`~app.transport.drain.Drain` calls back each
  stream it was given; the run is interrupted, its events end with ``response.failed``
  (``server_shutting_down``), and ``[DONE]`` follows. sse-starlette's own shutdown
  handling would cancel streams on the exit signal, before their terminal event; it is
  switched off for the process (:func:`leave_shutdown_to_the_drain`), so a stream ends
  only by its own end, its client, or its send timeout.
* **send timeout**: a write that the client has not taken within
  ``ORS_SSE_SEND_TIMEOUT`` (it reads nothing, its buffers are full) ends the stream as a
  client leaving does, and the connection is dropped: a client that stopped reading holds
  no run.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import AppStatus, SendTimeoutError
from starlette.background import BackgroundTask
from starlette.types import Receive, Scope, Send

from app.config import Settings
from app.engine.event_log import Emitted
from app.engine.run import Run
from app.errors import ServerError
from app.transport.drain import Drain

log = logging.getLogger("ors.http")

SEPARATOR = "\n"
DONE_FRAME = ServerSentEvent(data="[DONE]", sep=SEPARATOR).encode()
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class StreamOptions:
    """How streams are sent: seconds of silence before a ping (0: none), and seconds a
    write may wait for the client (0: no limit)."""

    ping_seconds: float = 15.0
    send_timeout: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> StreamOptions:
        return cls(ping_seconds=settings.sse_ping_seconds, send_timeout=settings.sse_send_timeout)


def leave_shutdown_to_the_drain() -> None:
    """Switch off sse-starlette's automatic shutdown handling, for this process: on the
    exit signal it cancels every open stream (after a grace period at most), while the
    :class:`Drain` ends each one with its terminal event first; and its flag, once set,
    stays set for the process, which would cut every stream of a server started later
    in the same process. Idempotent; every app of ours wants the same."""
    AppStatus.disable_automatic_graceful_drain()


def encode_event(event_type: str, data: str) -> bytes:
    """One SSE block: the ``event`` line, one ``data`` line (JSON never holds a raw
    newline), and the blank line."""
    return ServerSentEvent(data=data, event=event_type, sep=SEPARATOR).encode()


def _ping() -> ServerSentEvent:
    return ServerSentEvent(comment="ping", sep=SEPARATOR)


class EventStream(EventSourceResponse):
    """sse-starlette's response with the framing above. A stream whose client stopped
    reading (:class:`SendTimeoutError`) is logged and ends there: its body has been
    closed (the run ended as a client leaving ends it), and uvicorn closes the
    connection, as for any response an application leaves unfinished (it logs that too:
    no further write could reach that client)."""

    def __init__(self, body: AsyncIterator[bytes], options: StreamOptions,
                 background: BackgroundTask | None = None) -> None:
        super().__init__(
            body,
            headers=HEADERS,
            background=background,
            ping=options.ping_seconds,
            sep=SEPARATOR,
            ping_message_factory=_ping,
            send_timeout=options.send_timeout or None,
        )
        # sse-starlette says ``Connection: keep-alive``; whether the connection is kept
        # is the HTTP layer's choice (it closes it after an HTTP/1.0 stream, for one)
        del self.headers["connection"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:
            client = scope.get("client")
            log.warning("%sa stream's client read nothing for %gs: the stream ends",
                        f"{client[0]}:{client[1]} - " if client else "", self.send_timeout)


def stream_run(run: Run, drain: Drain, options: StreamOptions) -> EventStream:
    """The SSE response that reads a started run, one write per batch of its events. A
    body that never ran (its client left first) closes the run, which ends it as a reader
    leaving does; the run does everything else (recording, its ``on_end``)."""

    async def body() -> AsyncIterator[bytes]:
        forget = drain.when_draining(
            lambda: run.interrupt(ServerError("The server is shutting down.", code="server_shutting_down")))
        try:
            async with contextlib.aclosing(run.batches()) as batches:
                async for batch in batches:
                    chunk = b"".join([encode_event(emitted.type, emitted.data) for emitted in batch])
                    if run.ended:  # the terminal event, recorded: nothing follows it
                        yield chunk + DONE_FRAME
                        return
                    yield chunk
            yield DONE_FRAME
        finally:
            forget()

    return EventStream(body(), options, BackgroundTask(run.aclose))


def stream_emitted(events: AsyncIterator[Emitted], options: StreamOptions) -> EventStream:
    """An SSE response following events produced elsewhere (a background run, a run on
    another replica): its client going away does not stop the run."""

    async def body() -> AsyncIterator[bytes]:
        async for emitted in events:
            yield encode_event(emitted.type, emitted.data)
        yield DONE_FRAME

    return EventStream(body(), options)


def replay_events(events: Sequence[str], starting_after: int | None, options: StreamOptions) -> EventStream:
    """Stored events of a finished response, after sequence number ``starting_after``."""

    async def body() -> AsyncIterator[bytes]:
        for data in events:
            event = json.loads(data)
            if starting_after is None or event["sequence_number"] > starting_after:
                yield encode_event(event["type"], data)
        yield DONE_FRAME

    return EventStream(body(), options)
