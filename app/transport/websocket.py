"""The WebSocket transport on ``/v1/responses``.

Each client text frame is one ``{"type": "response.create", ...request body}``. The
server answers with the same event objects as SSE, one JSON object per frame, and no
``[DONE]``. Contract of a connection:

* **One response in flight.** Frames that arrive while a response runs wait in a queue and
  run strictly in order. The reader keeps reading meanwhile, so a client that goes away
  is noticed at once: the running response is cancelled, which stops generation.
* **Rate limits.** Each ``response.create`` is counted by the tenant's rate limits when
  its turn comes, and holds a place among the tenant's responses in flight while its
  response runs. A refusal is an error envelope (status 429, code
  ``rate_limit_exceeded``); nothing else happens to the connection, which stays open.
* **A bounded queue.** At most ``ORS_WS_MAX_QUEUED_FRAMES`` frames wait behind the running
  turn. A frame beyond that is dropped (its text is not kept) and answered at once with
  an error envelope: status 429, code ``too_many_queued_frames``, param ``type``; the
  connection stays open. At once rather than in its turn, so that a client flooding the
  connection learns it while the turns ahead still run (a client that waits for each
  turn's end, as the spec expects, never sees it). Each message is at most
  ``ORS_MAX_BODY_BYTES`` (the server closes the connection with 1009 on a bigger one).
* **Connection-local state.** The latest response of the connection is kept in memory
  (its whole history), so a ``store: false`` response can be continued on the same
  socket; stored ids are loaded from the store. A continuation that fails (any 4xx or
  5xx, except a rate-limit refusal, which comes before the request is looked at) evicts
  the id it referenced: continuing from it again on this connection fails with
  ``previous_response_not_found``.
* **One terminal message per turn.** A failure before the response starts is one error
  envelope ``{"type": "error", "status", "error": {...}}``; a failure after it started
  is one ``response.failed`` (no ``error`` event before it, unlike SSE). The socket stays
  open for the next turn.
* **The cap.** After ``ORS_WS_MAX_CONNECTION_SECONDS`` the running response (if any) ends
  with ``response.failed``, code ``websocket_connection_limit_reached``; an idle
  connection gets that error envelope. Queued turns that never started are dropped.
  Then the socket closes normally. Server shutdown does the same with
  ``server_shutting_down``, and the server closes its connections only once each has
  closed itself so (:meth:`app.transport.drain.Drain.hold`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from app.engine.body_decoding import decode_body
from app.engine.delivery import Delivery
from app.engine.engine import Engine
from app.engine.history import History, HistorySource, NoHistory, StoredHistory, merge_tools, not_found
from app.engine.items import from_stored
from app.engine.limits import RequestLimits
from app.engine.run import Run
from app.errors import InvalidRequest, ORSError, ServerError, TooManyRequests
from app.protocol.states import ResponseStatus
from app.transport.auth import KeyAuthenticator
from app.transport.drain import Drain
from app.transport.errors import error_response
from app.transport.guards import BodyBudget
from app.transport.ratelimit import RateLimiter

log = logging.getLogger("ors.websocket")

router = APIRouter()

FORBIDDEN_FIELDS = ("stream", "stream_options", "background")
LIMIT_CODE = "websocket_connection_limit_reached"


class ConnectionHistory(HistorySource):
    """The connection's latest response from memory, other ids from the store; evicted
    ids are never found again on this connection."""

    def __init__(self, fallback: HistorySource) -> None:
        self.fallback = fallback
        self.latest: tuple[str, History] | None = None
        self.evicted: set[str] = set()

    async def load(self, response_id: str) -> History:
        if response_id in self.evicted:
            raise not_found(response_id)
        if self.latest is not None and self.latest[0] == response_id:
            return self.latest[1]
        return await self.fallback.load(response_id)

    def remember(self, run: Run, past: History) -> None:
        output = [item.model_dump(mode="json") for item in run.response.output]
        own = [*run.input_items, *output]
        self.latest = (
            run.id,
            History(items=[*past.items, *(from_stored(item) for item in own)],
                    tools=merge_tools(past.tools, run.tools),
                    stored_items=[*past.stored_items, *own]),
        )

    def evict(self, response_id: str) -> None:
        self.evicted.add(response_id)
        if self.latest is not None and self.latest[0] == response_id:
            self.latest = None


class Connection:
    def __init__(self, socket: WebSocket, engine: Engine, tenant: str, drain: Drain,
                 max_seconds: float, max_queued: int, limiter: RateLimiter, bodies: BodyBudget | None = None) -> None:
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
        self.history = ConnectionHistory(fallback)
        self.max_queued = max_queued
        self.frames: asyncio.Queue[tuple[str | None, int]] = asyncio.Queue()
        self.waiting = 0
        """Frames in the queue."""
        self.busy = False
        """Whether the worker is handling a frame."""
        self.current: Run | None = None
        self.closing: ORSError | None = None

    async def serve(self) -> None:
        # the server shuts connections down once this one has closed itself (its running
        # response ended first), not while it may still be sending
        release = self.drain.hold()
        try:
            await self._serve()
        finally:
            release()

    async def _serve(self) -> None:
        reader = asyncio.create_task(self._read())
        worker = asyncio.create_task(self._work())
        limit = asyncio.create_task(self._limit())
        try:
            done, _ = await asyncio.wait({reader, worker, limit}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                # the client went away (or sent a close): stop whatever runs
                worker.cancel()
            elif limit in done:
                await self._close_after(worker, limit.result())
        finally:
            for task in (reader, worker, limit):
                task.cancel()
            for task in (reader, worker, limit):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            while not self.frames.empty():  # frames that never ran give their room back
                self.bodies.give_back(self.frames.get_nowait()[1])

    async def _read(self) -> None:
        try:
            while True:
                message = await self.socket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if self.waiting + self.busy > self.max_queued:
                    # this frame would wait behind the running one and max_queued others
                    await self._send(self._queue_full().websocket_envelope())
                    continue
                text = message.get("text")
                if text is None and message.get("bytes") is not None:
                    text = message["bytes"].decode("utf-8", errors="replace")
                size = len(text) if text is not None else 0
                if not self.bodies.take(size):
                    await self._send(self.bodies.full().websocket_envelope())
                    continue
                self.waiting += 1
                self.frames.put_nowait((text, size))
        except WebSocketDisconnect:
            return

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

    async def _close_after(self, worker: asyncio.Task[None], error: ORSError) -> None:
        """End the running response (if any) with ``error``, drop the queue, close cleanly."""
        self.closing = error
        if self.current is not None:
            # a turn is being sent (it may have just finished): let it end on its own
            # terminal event, never an envelope in the middle of it
            self.current.interrupt(error)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(worker), timeout=30)
        else:
            worker.cancel()
            await self._send(error.websocket_envelope())
        with contextlib.suppress(Exception):
            await self.socket.close(code=1000 if error.code == LIMIT_CODE else 1001)

    async def _work(self) -> None:
        while True:
            frame, size = await self.frames.get()
            self.waiting -= 1
            self.busy = True
            try:
                await self._turn(frame)
            finally:
                self.busy = False
                self.bodies.give_back(size)
            if self.closing is not None:
                return

    def _queue_full(self) -> ORSError:
        return TooManyRequests(
            f"Too many response.create frames are waiting on this connection (at most {self.max_queued} "
            "behind the running one); this one was dropped. Wait for a turn to end, or open another connection.",
            code="too_many_queued_frames",
            param="type",
        )

    async def _turn(self, frame: str) -> None:
        try:
            data = await _create_event(frame, self.engine.limits)
            lease = await self.limiter.acquire(self.tenant)
        except ORSError as error:
            await self._send(error.websocket_envelope())
            return
        async with lease:
            await self._respond(data)

    async def _respond(self, data: dict[str, Any]) -> None:
        try:
            previous = data.get("previous_response_id")
            past = (
                await self.history.load(previous) if isinstance(previous, str) and previous else History()
            )
            prepared = await self.engine.prepare(data, tenant=self.tenant, history=_Fixed(past))
            # its start recorded before any event: a store out of reach (or a chain
            # deleted meanwhile) is an error envelope, as over HTTP it is a plain error
            run = await self.engine.run(prepared, Delivery.WEBSOCKET)
        except ORSError as error:
            self._evict_referenced(data)
            await self._send(error.websocket_envelope())
            return
        self.current = run
        try:
            async with contextlib.aclosing(run.batches()) as batches:
                async for batch in batches:
                    for emitted in batch:
                        await self.socket.send_text(emitted.data)
        finally:
            self.current = None
            await run.aclose()  # never read (cancelled first): it ends as a reader leaving
        if run.response.status in (ResponseStatus.FAILED, ResponseStatus.CANCELLED):
            self._evict_referenced(data)
        else:
            self.history.remember(run, past)

    def _evict_referenced(self, data: Any) -> None:
        previous = data.get("previous_response_id") if isinstance(data, dict) else None
        if isinstance(previous, str):
            self.history.evict(previous)

    async def _send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):
            await self.socket.send_text(json.dumps(message, separators=(",", ":")))


class _Fixed(HistorySource):
    """A history already loaded (the connection resolved it, so it can evict on failure)."""

    def __init__(self, history: History) -> None:
        self.history = history

    async def load(self, response_id: str) -> History:
        return self.history


async def _create_event(frame: str | None, limits: RequestLimits) -> dict[str, Any]:
    if frame is None:
        raise InvalidRequest("Frames must be text holding one JSON object.", code="invalid_json")
    data = await decode_body(frame, limits, what="frame")
    if not isinstance(data, dict):
        raise InvalidRequest("A frame must be a JSON object.", code="invalid_type")
    if data.get("type") != "response.create":
        raise InvalidRequest(
            f"Unknown client event type {data.get('type')!r}: send 'response.create'.",
            code="invalid_type",
            param="type",
        )
    for name in FORBIDDEN_FIELDS:
        if name in data:
            raise InvalidRequest(
                f"'{name}' is not allowed on the WebSocket transport: every turn streams, one at a time.",
                code="invalid_value",
                param=name,
            )
    return {key: value for key, value in data.items() if key != "type"}


@router.websocket("/v1/responses")
async def responses_socket(socket: WebSocket) -> None:
    state = socket.app.state
    authenticator: KeyAuthenticator = state.authenticator
    try:
        tenant = authenticator.tenant(socket.headers.get("authorization"))
    except ORSError as error:
        await socket.send_denial_response(error_response(error))
        return
    await socket.accept()
    settings = state.settings
    connection = Connection(
        socket, state.engine, tenant, state.drain, settings.ws_max_connection_seconds,
        settings.ws_max_queued_frames, state.limiter, state.bodies,
    )
    await connection.serve()
