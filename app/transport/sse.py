"""Server-sent events exactly as the spec frames them.

Each event is written as one ``event: <type>`` line and one ``data: <json>`` line,
``\\n`` line endings, in a single send; no ``id:``; the stream ends with ``data: [DONE]``.
Keep-alive pings are SSE comments, which clients ignore.

Races (see ARCHITECTURE.md):

* client gone: :class:`EventStream`'s listener sees ``http.disconnect`` and cancels the
  body; the turn's pump task is cancelled with it and closes the backend stream,
  stopping generation.
* upstream fails: the turn itself turns the failure into ``error`` + ``response.failed``.
* server shutdown: the app's :class:`~app.transport.drain.Drain` calls back each stream
  it was given; the turn is interrupted, its events then end with ``response.failed``,
  and ``[DONE]`` follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from app.engine.runs import LiveTurns
from app.engine.turn import Emitted, Turn
from app.errors import ServerError
from app.transport.drain import Drain

PING_SECONDS = 15
LISTEN_AFTER_SECONDS = 0.05
"""How long a stream runs before its listener task starts (the client leaving, pings).
A stream in front of a fast upstream is over in a millisecond or two: it makes no
listener task (about 5% of such a stream's CPU at concurrency 16). A client that leaves
sooner is noticed this much later at most."""
DONE_FRAME = b"data: [DONE]\n\n"
PING_FRAME = b": ping\n\n"
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
"""No ``Connection`` header: whether the connection is kept is the HTTP layer's choice
(kept on HTTP/1.1; closed to end the body on HTTP/1.0, :mod:`app.transport.close_delimited`),
and a stream that said ``keep-alive`` beside the server's ``close`` contradicted itself."""


MEDIA_TYPE = "text/event-stream"
RAW_HEADERS = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in HEADERS.items()] + [
    (b"content-type", f"{MEDIA_TYPE}; charset=utf-8".encode("latin-1"))]
"""Every stream's headers, made once: what Starlette would make of :data:`HEADERS` and
the media type for each response."""


class Last(bytes):
    """The last chunk of a stream's body: :class:`EventStream` sends it as the end of the
    body, so the terminal events, ``[DONE]`` and the end of the chunked body leave in one
    write instead of three."""


def encode_event(event_type: str, data: str) -> bytes:
    """One SSE block: the ``event`` line, one ``data`` line (JSON never holds a raw
    newline), and the blank line."""
    return f"event: {event_type}\ndata: {data}\n\n".encode()


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response: each chunk of the body (whole SSE blocks) is one
    send.

    Contract:

    * Beside the body runs one task per stream, the listener, from
      :data:`LISTEN_AFTER_SECONDS` on (a stream over before then has none): it waits for
      the client to leave, and sends a ping comment every :data:`PING_SECONDS`. Nothing
      else runs per stream (sse-starlette's response ran four tasks, a task group and a cancel scope per
      send; at concurrency 16 in front of a fast upstream that was most of what a stream
      cost beyond a JSON answer).
    * The client leaving (``http.disconnect``) cancels the task that sends the body (a
      plain ``Task.cancel``, delivered once); the body is closed, its clean-up (recording
      the end) runs to its end, nothing more is sent, and the response ends normally
      (the cancel is taken back, ``Task.uncancel``). A cancel from anywhere else (the
      server's own, at a forced shutdown) goes on up. No anyio cancel scope per stream:
      entering and leaving two cost about 3% of a fast upstream's stream.
    * Sends never interleave inside a block: a ping goes out between two chunks (one lock),
      never after the end. A :class:`Last` chunk ends the body (nothing after it is read).
    * ``background`` is awaited once the body is over, however it ended.
    """

    def __init__(self, body: AsyncIterator[bytes], background: BackgroundTask | None = None) -> None:
        # what StreamingResponse.__init__ sets, with the headers that never vary made once
        self.body_iterator = body
        self.status_code = 200
        self.media_type = MEDIA_TYPE
        self.background = background
        self.raw_headers = list(RAW_HEADERS)
        self._lock = asyncio.Lock()
        self._gone = False
        self._complete = False
        self._streaming = True
        self._head_sent = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope.get("method") != "HEAD":
                await self._stream(receive, send)
            if not self._gone and not self._complete:
                async with self._lock:
                    await self._send_head(send)
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if self.background is not None:
                await self.background()

    async def _send_head(self, send: Send) -> None:
        """``http.response.start``, once, just before the first thing sent (under the
        lock): the head leaves with the first chunk, in one write
        (:mod:`app.transport.head`)."""
        if not self._head_sent:
            self._head_sent = True
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})

    async def _stream(self, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        listener: asyncio.Task[None] | None = None

        def start_listening() -> None:
            nonlocal listener
            if self._streaming:
                listener = asyncio.create_task(self._listen(receive, send, task))

        timer = asyncio.get_running_loop().call_later(LISTEN_AFTER_SECONDS, start_listening)
        try:
            async with contextlib.aclosing(self.body_iterator) as body:  # type: ignore[type-var]
                async for chunk in body:
                    last = isinstance(chunk, Last)
                    async with self._lock:
                        if not self._head_sent:
                            await self._send_head(send)
                        await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                    if last:
                        self._complete = True
                        break
        except asyncio.CancelledError:
            # the listener's cancel (the client left) ends the body, not the response;
            # any other goes on
            if not self._gone or task.uncancel() > 0:
                raise
        finally:
            self._streaming = False
            timer.cancel()
            if listener is not None:
                listener.cancel()

    async def _listen(self, receive: Receive, send: Send, streaming: asyncio.Task[None]) -> None:
        while True:
            try:
                async with asyncio.timeout(PING_SECONDS):
                    message: Message = await receive()
            except TimeoutError:
                async with self._lock:
                    await self._send_head(send)
                    await send({"type": "http.response.body", "body": PING_FRAME, "more_body": True})
                continue
            if message["type"] == "http.disconnect":
                if self._streaming:
                    self._gone = True
                    streaming.cancel()
                return


def stream_turn(turn: Turn, drain: Drain, live: LiveTurns,
                on_end: Callable[[], Awaitable[None]] | None = None) -> EventStream:
    """The SSE response that drives a prepared turn. ``on_end`` (idempotent) is awaited
    once the turn has ended, before ``[DONE]``, and in any case when the response is
    over, also if its body never started."""

    over = False

    async def ended() -> None:  # the first call does it; the others (finally, background) find it done
        nonlocal over
        if over:
            return
        over = True
        await turn.discard()  # opened, but the body never ran: the client left first
        if on_end is not None:
            await on_end()

    async def body() -> AsyncIterator[bytes]:
        forget = drain.when_draining(
            lambda: turn.interrupt(ServerError("The server is shutting down.", code="server_shutting_down")))
        try:
            # the turn's batches read here, not through a generator that passes them on
            with live.tracking(turn):
                async with contextlib.aclosing(turn.batches()) as batches:
                    async for batch in batches:  # one send per batch
                        chunk = b"".join([encode_event(emitted.type, emitted.data) for emitted in batch])
                        if turn.ended:  # the terminal event, recorded: nothing follows it
                            await ended()
                            yield Last(chunk + DONE_FRAME)
                            return
                        yield chunk
            await ended()
            yield Last(DONE_FRAME)
        finally:
            forget()
            await ended()

    return EventStream(body(), BackgroundTask(ended))


def stream_emitted(events: AsyncIterator[Emitted]) -> EventStream:
    """An SSE response following events produced elsewhere (a background run): the
    listener going away does not stop the run."""

    async def body() -> AsyncIterator[bytes]:
        async for emitted in events:
            yield encode_event(emitted.type, emitted.data)
        yield Last(DONE_FRAME)

    return EventStream(body())


def replay_events(events: Sequence[str], starting_after: int | None) -> EventStream:
    """Stored events of a finished response, after sequence number ``starting_after``."""

    async def body() -> AsyncIterator[bytes]:
        for data in events:
            event = json.loads(data)
            if starting_after is None or event["sequence_number"] > starting_after:
                yield encode_event(event["type"], data)
        yield Last(DONE_FRAME)

    return EventStream(body())
