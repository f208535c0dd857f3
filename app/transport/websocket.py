"""The WebSocket transport on ``/v1/responses``: the spec's WebSocket mode, and OpenAI's.

Each client text frame is one client event (:mod:`app.transport.ws_frames`), above all
``{"type": "response.create", ...request body}``. The server answers with the same event
objects as SSE, one JSON object per frame, and no ``[DONE]``. The upgrade needs nothing
but the key: headers such as Codex's ``OpenAI-Beta: responses_websockets=2026-02-06``,
``session-id`` or ``originator`` are accepted and change nothing, and permessage-deflate
is negotiated when asked. Contract of a connection:

* **One response in flight per stream.** A ``response.create`` may carry a
  ``stream_id`` (OpenAI's multiplexing); frames without one form one stream of their own,
  so a client that never sends one has exactly the spec's single-response connection.
  Within a stream, frames that arrive while a response runs wait, and run strictly in
  order; different streams run at once (:mod:`app.transport.ws_streams`). Every event of
  a response, and every error envelope answering its frame, carries the ``stream_id`` it
  was created with (and none without one). The reader keeps reading meanwhile, so a
  client that goes away is noticed at once: every running response is cancelled, which
  stops generation.
* **Warm-ups.** ``generate: false`` makes a response that completes at once
  (``response.created``, ``response.in_progress``, ``response.completed``) with no output
  and zero usage, and without a model call: its instructions, tools and input are recorded
  (stored, or remembered on the connection, as any response), so the next turn chains
  from it with ``previous_response_id`` and only new input. As in any chain, instructions
  and tools are not inherited: a turn sends its own (Codex resends both). On the embedded
  models the warm-up's prompt is evaluated into the prompt cache in the background, and
  the next turn that begins with it waits for that, then reuses it
  (:mod:`app.backends.warm_ups`).
* **Rate limits.** Each ``response.create`` is counted by the tenant's rate limits when
  its turn comes, and holds a place among the tenant's responses in flight while its
  response runs. A refusal is an error envelope (status 429, code
  ``rate_limit_exceeded``); nothing else happens to the connection, which stays open.
* **Bounds, at once.** At most ``ORS_WS_MAX_QUEUED_FRAMES`` frames wait behind a stream's
  running turn, and at most ``ORS_WS_MAX_STREAMS`` streams hold work at once. A frame
  beyond either is dropped (its text is not kept) and answered at once with an error
  envelope: status 429, code ``too_many_queued_frames`` (param ``type``) or
  ``too_many_streams`` (param ``stream_id``); the connection stays open. At once rather
  than in its turn, so that a client flooding the connection learns it while the turns
  ahead still run (a client that waits for each turn's end, as the spec expects, never
  sees it). A frame without ``stream_id`` in its text is refused before it is even
  decoded. Each message is at most ``ORS_MAX_BODY_BYTES`` (the server closes the
  connection with 1009 on a bigger one).
* **Connection-local state.** The latest response of each stream (of the
  ``ORS_WS_MAX_STREAMS`` most recently used) is kept in memory with its whole history, so
  a ``store: false`` response can be continued on the same socket, from its own stream or
  from another (a fork onto a new stream); stored ids are loaded from the store. A fork
  names a response that has ended. A continuation that fails (any 4xx or 5xx, except a
  rate-limit refusal, which comes before the request is looked at) evicts the id it
  referenced: continuing from it again on this connection fails with
  ``previous_response_not_found`` (:mod:`app.transport.ws_history`).
* **One terminal message per turn.** A failure before the response starts is one error
  envelope ``{"type": "error", "status", "error": {...}}``, in its turn; a failure after
  it started is one ``response.failed`` (no ``error`` event before it, unlike SSE). The
  socket stays open for the next turn. ``response.steer`` is answered at once with
  ``response.steer.failed`` (``steering_not_supported``): steering is not supported.
* **Keys from browsers** (:data:`KEY_PROTOCOL`): the key may come as an offered subprotocol.
* **The cap.** After ``ORS_WS_MAX_CONNECTION_SECONDS`` each running response ends with
  ``response.failed``, code ``websocket_connection_limit_reached``; a connection with
  none running gets that error envelope (without ``stream_id``). Queued turns that never
  started are dropped. Then the socket closes normally. Server shutdown does the same
  with ``server_shutting_down``, and the server closes its connections only once each
  has closed itself so (:meth:`app.transport.drain.Drain.hold`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from app.engine.delivery import Delivery
from app.engine.engine import Engine
from app.engine.history import History, NoHistory, StoredHistory
from app.errors import InvalidRequest, ORSError, ServerError
from app.protocol.states import ResponseStatus
from app.transport.auth import KeyAuthenticator
from app.transport.drain import Drain
from app.transport.errors import error_response
from app.transport.guards import BodyBudget
from app.transport.ratelimit import RateLimiter
from app.transport.ws_frames import STREAM_KEY, Frame, FrameKind, create_body, read_frame, steer_failed, tagged
from app.transport.ws_history import ConnectionHistory, Fixed
from app.transport.ws_streams import Lane, Streams

log = logging.getLogger("ors.websocket")

router = APIRouter()

LIMIT_CODE = "websocket_connection_limit_reached"


class Connection:
    def __init__(self, socket: WebSocket, engine: Engine, tenant: str, drain: Drain,
                 max_seconds: float, max_queued: int, limiter: RateLimiter, bodies: BodyBudget | None = None,
                 max_streams: int = 1) -> None:
        self.socket = socket
        self.bodies = bodies if bodies is not None else BodyBudget(0)
        """Counts each frame's characters from its arrival until its turn is over (the
        server's bound on request bodies in flight, ``ORS_MAX_BODY_BYTES_IN_FLIGHT``)."""
        self.limiter = limiter
        self.engine = engine
        self.tenant = tenant
        self.drain = drain
        self.max_seconds = max_seconds
        fallback = (StoredHistory(engine.store, tenant, engine.history_cache) if engine.store is not None
                    else NoHistory())
        self.history = ConnectionHistory(fallback, keep=max_streams)
        self.streams = Streams(max_streams=max_streams, max_queued=max_queued, turn=self._turn,
                               release=lambda frame: self.bodies.give_back(frame.size))

    async def serve(self) -> None:
        # the server shuts connections down once this one has closed itself (its running
        # responses ended first), not while it may still be sending
        release = self.drain.hold()
        try:
            await self._serve()
        finally:
            release()

    async def _serve(self) -> None:
        reader = asyncio.create_task(self._read())
        limit = asyncio.create_task(self._limit())
        try:
            done, _ = await asyncio.wait({reader, limit}, return_when=asyncio.FIRST_COMPLETED)
            if limit in done:
                await self._close_after(limit.result())
            # else the client went away (or sent a close): whatever runs is cancelled below
        finally:
            for task in (reader, limit):
                task.cancel()
            for task in (reader, limit):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self.streams.cancel()

    async def _read(self) -> None:
        try:
            while True:
                message = await self.socket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                text = message.get("text")
                if text is None and message.get("bytes") is not None:
                    text = message["bytes"].decode("utf-8", errors="replace")
                await self._arrived(text)
        except WebSocketDisconnect:
            return

    async def _arrived(self, text: str | None) -> None:
        """Route one frame to its stream, or answer it at once (refused, steer, processed)."""
        plain = text is None or STREAM_KEY not in text
        if plain and (refused := self.streams.refusal(None)) is not None:
            # refused before it is decoded or counted, as a flood should be
            await self._send(refused.websocket_envelope())
            return
        size = len(text) if text is not None else 0
        if not self.bodies.take(size):
            await self._send(self.bodies.full().websocket_envelope())
            return
        frame = await read_frame(text, size, self.engine.limits)
        if frame.kind is FrameKind.CREATE or frame.kind is FrameKind.INVALID:
            # a plain frame of the stream without stream_id was let through above
            refused = None if plain and frame.stream is None else self.streams.refusal(frame.stream)
            if refused is not None:
                self.bodies.give_back(size)
                await self._send(refused.websocket_envelope(), frame.stream)
                return
            self.streams.put(frame.stream, frame)
            return
        self.bodies.give_back(size)
        if frame.kind is FrameKind.STEER and frame.data is not None:
            await self._send(steer_failed(frame.data, self._stream_of(frame.data.get("previous_response_id"))))
        # response.processed: nothing to do

    def _stream_of(self, response_id: object) -> str | None:
        if not isinstance(response_id, str):
            return None
        for lane in self.streams.lanes.values():
            if lane.run is not None and lane.run.id == response_id:
                return lane.key
        return self.history.stream_of(response_id)

    async def _limit(self) -> ORSError:
        """Resolves with the error that ends the connection: the cap, or shutdown."""
        cap = asyncio.create_task(asyncio.sleep(self.max_seconds))
        stop = asyncio.create_task(self.drain.wait())
        try:
            done, _ = await asyncio.wait({cap, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cap.cancel()
            stop.cancel()
        if stop in done:
            return ServerError("The server is shutting down; reconnect to continue.", code="server_shutting_down")
        return InvalidRequest(
            f"This connection reached its limit of {self.max_seconds:g} seconds; open a new one to continue.",
            code=LIMIT_CODE,
        )

    async def _close_after(self, error: ORSError) -> None:
        """End each running response with ``error``, drop what waits, close cleanly."""
        self.streams.stop()
        running = {lane.task: lane.run for lane in self.streams.lanes.values()
                   if lane.run is not None and lane.task is not None}
        for run in running.values():
            # each is being sent (it may have just finished): let it end on its own
            # terminal event, never an envelope in the middle of it
            run.interrupt(error)
        await self.streams.cancel([task for task in self.streams.tasks() if task not in running])
        if running:  # the turns not yet started were dropped
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(asyncio.gather(*running)), timeout=30)
        else:
            await self._send(error.websocket_envelope())
        with contextlib.suppress(Exception):
            await self.socket.close(code=1000 if error.code == LIMIT_CODE else 1001)

    async def _turn(self, lane: Lane, frame: Frame) -> None:
        try:
            if frame.error is not None or frame.data is None:
                raise frame.error or ServerError("The server could not read this frame.")
            body, generate = create_body(frame.data)
            lease = await self.limiter.acquire(self.tenant)
        except ORSError as error:
            await self._send(error.websocket_envelope(), lane.key)
            return
        async with lease:
            await self._respond(lane, body, generate)

    async def _respond(self, lane: Lane, data: dict[str, Any], generate: bool) -> None:
        try:
            previous = data.get("previous_response_id")
            past = (
                await self.history.load(previous) if isinstance(previous, str) and previous else History()
            )
            prepared = await self.engine.prepare(data, tenant=self.tenant, history=Fixed(past), generate=generate)
            # its start recorded before any event: a store out of reach (or a chain
            # deleted meanwhile) is an error envelope, as over HTTP it is a plain error
            run = await self.engine.run(prepared, Delivery.WEBSOCKET)
        except ORSError as error:
            self._evict_referenced(data)
            await self._send(error.websocket_envelope(), lane.key)
            return
        lane.run = run
        try:
            async with contextlib.aclosing(run.batches()) as batches:
                async for batch in batches:
                    for emitted in batch:  # one frame each, whole: streams interleave between frames
                        await self.socket.send_text(tagged(emitted.data, lane.key))
        finally:
            lane.run = None
            await run.aclose()  # never read (cancelled first): it ends as a reader leaving
        if run.response.status in (ResponseStatus.FAILED, ResponseStatus.CANCELLED):
            self._evict_referenced(data)
        else:
            self.history.remember(lane.key, run, past)

    def _evict_referenced(self, data: Any) -> None:
        previous = data.get("previous_response_id") if isinstance(data, dict) else None
        if isinstance(previous, str):
            self.history.evict(previous)

    async def _send(self, message: dict[str, Any], stream: str | None = None) -> None:
        if stream is not None:
            message = {**message, "stream_id": stream}
        with contextlib.suppress(Exception):
            await self.socket.send_text(json.dumps(message, separators=(",", ":")))


@router.websocket("/v1/responses")
async def responses_socket(socket: WebSocket) -> None:
    state = socket.app.state
    authenticator: KeyAuthenticator = state.authenticator
    offered: list[str] = socket.scope.get("subprotocols") or []
    try:
        tenant = authenticator.tenant(socket.headers.get("authorization") or _key_in(offered))
    except ORSError as error:
        await socket.send_denial_response(error_response(error))
        return
    await socket.accept(subprotocol=next((p for p in offered if not p.startswith(KEY_PROTOCOL)), None))
    settings = state.settings
    connection = Connection(
        socket, state.engine, tenant, state.drain, settings.ws_max_connection_seconds,
        settings.ws_max_queued_frames, state.limiter, state.bodies, max_streams=settings.ws_max_streams,
    )
    await connection.serve()


KEY_PROTOCOL = "openai-insecure-api-key."
"""A browser cannot set a WebSocket's headers: it offers its key as a subprotocol,
``openai-insecure-api-key.<key>``, as OpenAI's Realtime API takes it from browsers, beside
a subprotocol the server selects (the playground offers ``responses``); the key's own
protocol is never selected, so the key is not echoed. An ``Authorization`` header wins."""


def _key_in(offered: list[str]) -> str | None:
    for protocol in offered:
        if protocol.startswith(KEY_PROTOCOL):
            return f"Bearer {protocol[len(KEY_PROTOCOL):]}"
    return None
