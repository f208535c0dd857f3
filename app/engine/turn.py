"""Running one response: backend → guards → builder → events.

A :class:`Turn` is made by :meth:`app.engine.engine.Engine.prepare`, which has already
done everything that can fail before a stream starts. :meth:`Turn.events` then drives the
backend and yields :class:`Emitted` events, each serialized exactly once. Its contract:

* The first events are ``response.created`` and ``response.in_progress`` (a background
  response is ``queued`` first); the last is exactly one terminal event, whatever fails:
  a backend error becomes ``error`` + ``response.failed``; an unexpected exception
  becomes a ``server_error`` failure.
* The backend stream is consumed by one pump task that hands deltas over a bounded
  queue (:class:`~app.engine.handoff.Handoff`; backpressure: a slow reader slows the
  pump, never the other way round).
* Control (:meth:`Turn.cancel`, :meth:`Turn.interrupt` for shutdown and the connection
  cap) never goes through that queue, so it can neither fail on a full queue nor wait
  behind queued deltas. A signal is written to a one-slot control cell (the first signal
  wins) and takes effect at once:

  - the pump task is cancelled, which closes the backend stream: generation stops even
    while nobody reads;
  - the consumer reads the cell after every ``queue.get()`` and before its next one, so
    the next event it makes is the end (``response.incomplete`` with status
    ``cancelled``, or ``response.failed``), whatever is still queued;
  - a consumer blocked in ``queue.get()`` (the queue is then empty) is woken by a wake
    marker put on the queue; an empty queue always has room for it, and a queue that
    holds anything does not block its consumer, so it is put only when there is room.

  The per-delta cost is one attribute read: no extra task, future or ``wait`` per token.
  A slow reader still sees the end only when it asks for its next event (an async
  generator cannot be resumed by anyone else); a background turn is read by its own task.
* Storage (``store: true``, what each write holds: :mod:`app.engine.recording`): the
  response and its input items are recorded before the first event is yielded, and its
  output and events when the terminal event is made.
  Nothing is written per delta. The pump starts before that first write, so the model
  works while the start is recorded (what it makes waits in the queue until the start is
  durable); if the write fails, the pump is cancelled and awaited before the error is
  raised. A stored stream (not background) opened while other responses are in flight
  (:class:`InFlight`) first waits up to :data:`ANSWERED_AT_ONCE_SECONDS` for the
  model: if the backend's stream is over by then (its whole answer queued), the
  response is recorded once, whole, with its events,
  before any event is yielded (one write instead of two, and one batch); nobody can know
  its id before then. If that write fails, :meth:`open` raises, as a start that cannot
  be recorded does, and nothing is ever yielded.
* The turn's :class:`TurnPhase` moves ``PREPARED`` → ``RUNNING`` → ``ENDED`` and never
  back. ``ENDED`` means its outcome is final: the terminal event was made and recorded,
  or the turn failed before its first event (:meth:`wait_started` then raises that
  failure), or it was dropped before it ran. Waiters (:meth:`wait_started`,
  :meth:`wait_ended`, :meth:`follow`) are woken by events, never by polling.
* If the consumer stops iterating (client gone, task cancelled), the pump is cancelled,
  which closes the backend stream and stops generation; the response is closed
  ``incomplete`` (reason ``client_disconnected``) and that end is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import anyio

from app.backends.base import Backend, GenerationRequest
from app.engine.builder import ResponseBuilder
from app.engine.handoff import Handoff
from app.engine.output_format import checks_output_format, enforce_output_format
from app.engine.recording import Recording
from app.engine.tools import ToolCallGuard, enforce_tool_policy
from app.errors import ModelError, ORSError, ServerError
from app.metrics import Metrics
from app.protocol.events import StreamEvent, serialize_event
from app.protocol.responses import CreateResponseBody, ResponseResource, response_json
from app.protocol.states import ResponseStatus
from app.store.base import ResponseStore

log = logging.getLogger("ors.turn")

_QUEUE_SIZE = 256
_END = object()
_WAKE = object()
"""Put on an empty delta queue to wake a consumer blocked on it when a control signal
arrives; it carries nothing (the signal is in the control cell)."""


TURNS_FOR_THE_REQUEST = 1
"""Turns of the loop a turn with nothing to record at its start gives its pump before it
makes the start: an upstream's request is written in the pump's first step (on a kept-
alive connection; opening one takes longer whatever the turn does), so the request
leaves before the start is made and sent. (With aiohttp, which writes a request from a
task of its own, it took two.)"""

ANSWERED_AT_ONCE_SECONDS = 0.005
"""How long a stored stream's start waits for the model before it is recorded, while
other responses are in flight (:meth:`Turn.open`). A model that answers whole
within it (the whole answer queued, the backend's stream over: a fast upstream, a
cached answer) is recorded once, whole, with its end, and its events leave in one send;
one that does not has its start recorded then (its first output, if any came
meanwhile, waits for that write). See ARCHITECTURE.md, "The hot path"."""


class InFlight:
    """How many turns of one engine are in flight: opened (:meth:`Turn.open`) and not yet
    ended. What tells a stored stream whether the server is busy."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class TurnPhase(enum.Enum):
    PREPARED = "prepared"
    """Made by the engine; :meth:`Turn.events` has not begun."""
    RUNNING = "running"
    """Recording its start or producing events."""
    ENDED = "ended"
    """Its outcome is final (recorded), or it failed before its first event."""


class Emitted(NamedTuple):
    """One event as it leaves the engine: its type and its JSON, made once."""

    type: str
    data: str


@dataclass(frozen=True, slots=True)
class _Interrupted:
    error: ORSError


@dataclass(frozen=True, slots=True)
class _Cancelled:
    pass


class Turn:
    """One response being produced. :meth:`events` may be iterated once; background
    turns are driven by a task and observed with :meth:`follow`."""

    def __init__(
        self,
        *,
        body: CreateResponseBody,
        backend: Backend,
        request: GenerationRequest,
        initial: ResponseResource,
        tenant: str,
        store: ResponseStore | None,
        input_items: Callable[[], list[dict[str, Any]]],
        tools: list[dict[str, Any]],
        error_events: bool = True,
        seal_reasoning: Callable[[str], str] | None = None,
        metrics: Metrics | None = None,
        on_recorded: Callable[[list[dict[str, Any]]], None] | None = None,
        in_flight: InFlight | None = None,
    ) -> None:
        self.body = body
        self._in_flight = in_flight
        self._counted = False
        self.metrics = metrics
        self.backend = backend
        self.request = request
        self.initial = initial
        self.tenant = tenant
        self.store = store
        self._input_items = input_items
        self.tools = tools
        self._error_events = error_events
        self._seal_reasoning = seal_reasoning
        self.builder = self._builder(events=True)
        self.error: ORSError | None = None
        self.start_error: BaseException | None = None
        """What ended the turn before its first event, if anything did."""
        self.emitted: list[Emitted] = []
        self.phase = TurnPhase.PREPARED
        self._changed = asyncio.Event()
        """Set (and replaced) whenever an event is emitted or the turn ends, if anyone
        waits on it (``_watchers``): a turn nobody follows allocates nothing per event."""
        self._watchers = 0
        self._queue: Handoff[object] | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._control: _Cancelled | _Interrupted | None = None
        self._unrecorded: ORSError | None = None
        """Why the end could not be recorded, if it could not."""
        self._started_at = 0.0
        self._first_output_at: float | None = None
        self._opened = False
        self._whole: list[Emitted] | None = None
        """A stored stream answered at once: all its events, recorded whole by :meth:`open`."""
        self._first_put: asyncio.Future[None] | None = None
        """Resolved (on the loop's next turn) by the pump's first put, while :meth:`open`
        waits for the model."""
        self._defer = False
        self._serialize = True
        self._recording = None if store is None else Recording(
            store, tenant=tenant, response_id=initial.id, tools=tools, input_items=input_items,
            on_recorded=on_recorded)
        """What it writes (``store: true``; :mod:`app.engine.recording`)."""

    def _builder(self, *, events: bool) -> ResponseBuilder:
        return ResponseBuilder(
            self.initial,
            error_events=self._error_events,
            seal_reasoning=self._seal_reasoning,
            logprobs=self.request.sampling.logprobs,
            offered={f.name: f for f in self.body.function_tools if f.namespace or f.custom},
            events=events,
        )

    @property
    def id(self) -> str:
        return self.initial.id

    @property
    def input_items(self) -> list[dict[str, Any]]:
        """The request's input items in stored form, ids assigned. Made when first asked
        for (``input_items`` returns the same list each time): a response neither stored
        nor continued on a WebSocket never needs them, and an agent's conversation sent
        whole is a hundred items or more."""
        return self._input_items()

    @property
    def answer(self) -> str | None:
        """The final response's JSON once its end is recorded (made once: the store and a
        JSON answer share it); ``None`` for a turn that is not stored."""
        return None if self._recording is None else self._recording.answer

    @property
    def response(self) -> ResponseResource:
        return self.builder.response

    @property
    def finished(self) -> bool:
        return self.builder.finished

    @property
    def ended(self) -> bool:
        return self.phase is TurnPhase.ENDED

    # ------------------------------------------------------------ control

    def interrupt(self, error: ORSError) -> None:
        """End the turn early with ``error`` (shutdown, connection cap); the events then
        end with ``response.failed``. Safe to call from any task on the loop, any number
        of times; never blocks, never raises."""
        self._signal(_Interrupted(error))

    def cancel(self) -> None:
        """Stop at the client's request: the response ends ``cancelled``. Like
        :meth:`interrupt`, it never blocks nor raises."""
        self._signal(_Cancelled())

    def _signal(self, message: _Cancelled | _Interrupted) -> None:
        if self.finished or self.ended or self._control is not None:
            return
        self._control = message
        pump = self._pump_task
        if pump is not None:
            pump.cancel()
        queue = self._queue
        if queue is not None and not queue.full():
            queue.put_nowait(_WAKE)

    # ------------------------------------------------------------ waiting

    async def wait_started(self) -> None:
        """Until the first event exists. If the turn ended without one (its start could
        not be recorded, or it was dropped before it ran), raise why, as an ORSError."""
        while not self.emitted:
            if self.ended:
                error = self.start_error
                if isinstance(error, ORSError):
                    raise error
                raise ServerError("The server could not start this response.")
            await self._await_change(self._changed)

    async def wait_ended(self) -> None:
        """Until the turn's outcome is final (see :class:`TurnPhase`)."""
        while not self.ended:
            await self._await_change(self._changed)

    def abandon(self) -> None:
        """Mark a turn whose driver stopped as ended, if it is not already: a task
        cancelled before it ever ran leaves nothing else to do it."""
        self._mark_ended()

    def _mark_ended(self) -> None:
        self._leave()
        if self.phase is TurnPhase.ENDED:
            return
        self.phase = TurnPhase.ENDED
        self._wake()

    async def _await_change(self, changed: asyncio.Event) -> None:
        self._watchers += 1
        try:
            await changed.wait()
        finally:
            self._watchers -= 1

    def _wake(self) -> None:
        if not self._watchers:
            return  # nobody waits; a watcher checks the state before it waits
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # ------------------------------------------------------------ driving

    async def events(self) -> AsyncIterator[Emitted]:
        """The events one by one (see :meth:`batches`)."""
        async with contextlib.aclosing(self.batches()) as batches:
            async for batch in batches:
                for emitted in batch:
                    yield emitted

    async def batches(self) -> AsyncIterator[list[Emitted]]:
        """Drive the turn; the events in batches, each non-empty. A batch is what exists
        at once: the start, or every delta already queued when the consumer asks (a burst
        from the backend becomes one batch, and a transport writes it with one send); a
        delta is never held back to wait for another. Each batch is emitted (recorded)
        whole before it is yielded, so a consumer leaving between batches never leaves a
        gap in the sequence numbers."""
        builder = self.builder
        if self.phase is TurnPhase.ENDED and self._whole is None:
            return  # over before it was driven: its whole answer could not be recorded
        if self.phase is TurnPhase.PREPARED:
            self.phase = TurnPhase.RUNNING
        began = False
        if not self._started_at:
            self._started_at = time.monotonic()
        if self.metrics is not None:
            self.metrics.response_started()
        try:
            await self.open()
            if self._whole is not None:  # answered at once, recorded whole (open)
                began = True
                whole, self._whole = self._whole, None
                yield whole
                return
            if self._queue is None and builder.status is not ResponseStatus.QUEUED:
                # The model's request leaves before the start is made and sent (turns
                # of the loop let the pump send it); a stored stream's pump is running
                # already (:meth:`open`).
                self._start_pump()
                for _ in range(TURNS_FOR_THE_REQUEST):
                    await asyncio.sleep(0)
            began = True
            batch = [self._emit(event) for event in builder.start()]
            if builder.status is ResponseStatus.QUEUED:
                yield batch
                batch = [self._emit(event) for event in builder.begin()]
                await self._record_status()
            self._start_pump()
            queue = self._queue
            assert queue is not None
            if queue.empty() or self._control is not None:
                if batch:
                    yield batch
                batch = []
            # else the model's output came while the start was recorded: it joins the
            # start's batch (one send), as any output already queued joins a batch
            while not builder.finished:
                got = self._control
                if got is None:
                    got = await queue.get()
                    # a signal that came while waiting wins over whatever was queued
                    got = self._control or got
                last = [self._emit(event) for event in self._next_events(got)]
                # what else is already queued joins this batch (never waited for)
                while not builder.finished and not queue.empty() and self._control is None:
                    batch += last
                    last = [self._emit(event) for event in self._next_events(queue.get_nowait())]
                if builder.finished:
                    if batch and self.store is not None:  # what came before the end does
                        yield batch                       # not wait for its write
                        batch = []
                    # durable before the client sees the end: a client may fetch or
                    # continue the response the moment it reads the terminal event
                    await self._settle()
                    if self._unrecorded is not None:  # not durable: not announced as ended well
                        last = self._fail_unrecorded(last)
                        await self._record_later()
                batch += last
                if batch:
                    yield batch
                batch = []
        except BaseException as exc:
            if not self.emitted and self.start_error is None:
                self.start_error = exc
            raise
        finally:
            pump = self._pump_task
            if pump is not None:
                pump.cancel()
            if self._quiet_end(began):  # nothing left to wait for: no shield to enter
                self._mark_ended()
                self._observe(began)
            else:
                with anyio.CancelScope(shield=True):
                    if pump is not None:
                        with contextlib.suppress(asyncio.CancelledError):
                            await pump
                    if began and not builder.finished:
                        for event in builder.stop("client_disconnected"):
                            self._emit(event)
                    if began:
                        await self._settle()
                    self._mark_ended()
                    self._observe(began)

    def _quiet_end(self, began: bool) -> bool:
        """Whether a turn's end has nothing to wait for: its pump is over (or never
        started) and its end is recorded (or never will be). The usual end of a turn
        that finished; entering a shielded cancel scope costs about 3% of a fast
        upstream's request, spent only when the end must wait (a pump still running, a
        stop to record)."""
        pump = self._pump_task
        if pump is not None and (not pump.done() or (not pump.cancelled() and pump.exception() is not None)):
            return False  # running, or its failure is still to be raised
        if not began:
            return True
        return self.builder.finished and (self._recording is None or self._recording.end_written)

    def _next_events(self, got: object) -> list[StreamEvent]:
        builder = self.builder
        try:
            if isinstance(got, _Cancelled):
                return builder.cancel()
            if isinstance(got, _Interrupted):
                raise got.error
            if got is _WAKE:
                return []
            if isinstance(got, BaseException):
                raise got
            if got is _END:
                raise ModelError("The model stream ended without a finish.", code="model_stream_ended")
            if self._first_output_at is None:
                self._first_output_at = time.monotonic()
            return builder.feed(got)  # type: ignore[arg-type]
        except ORSError as exc:
            self.error = exc
            log.warning("response %s failed: %r", self.id, exc)
            return builder.fail(exc)
        except Exception:
            log.exception("response %s failed unexpectedly", self.id)
            self.error = ServerError("The server failed while generating this response.")
            return builder.fail(self.error)

    def _observe(self, began: bool) -> None:
        """Once per turn, when it ends: what ``/metrics`` counts of a response."""
        if self.metrics is None:
            return
        self.metrics.response_left()
        if not began:
            return
        response = self.builder.response
        usage = response.usage
        self.metrics.response_ended(
            model=self.request.model,
            status=str(response.status),
            error_code=response.error.code if response.error is not None else None,
            seconds=time.monotonic() - self._started_at,
            first_output_seconds=None if self._first_output_at is None else self._first_output_at - self._started_at,
            input_tokens=usage.input_tokens if usage else 0,
            output_tokens=usage.output_tokens if usage else 0,
            cached_tokens=usage.input_tokens_details.cached_tokens if usage else 0,
        )

    async def _pump(self, queue: Handoff[object]) -> None:
        """Move the backend's deltas into the queue through the tool policy (a
        :class:`ToolCallGuard` called in this loop); owns (and always closes) the stream.
        A strict ``text.format`` is checked on what the policy passed, so with one the
        policy runs as a generator below the format's check."""
        request = self.request
        source = self.backend.stream(request)
        guard: ToolCallGuard | None = None
        if checks_output_format(request):
            stream = enforce_output_format(enforce_tool_policy(source, request), request)
        else:
            stream, guard = source, ToolCallGuard(request)
        try:
            async for delta in stream:
                passed = delta if guard is None else guard.feed(delta)
                if passed is not delta:  # calls released, a finish: a few per response
                    for each in passed:  # type: ignore[union-attr]
                        await queue.put(each)
                elif queue.full():  # the consumer is behind: wait for room
                    await queue.put(delta)
                else:
                    queue.put_nowait(delta)
                if self._first_put is not None:
                    self._tell_first_put()
            await queue.put(_END)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put(exc)
        finally:
            if self._first_put is not None:
                self._tell_first_put()
            await stream.aclose()  # type: ignore[attr-defined]

    def _emit(self, event: StreamEvent) -> Emitted:
        emitted = Emitted(event.type, serialize_event(event))
        self.emitted.append(emitted)
        if self._watchers:  # most turns have none: no call per event to find that out
            self._wake()
        return emitted

    async def run(self) -> ResponseResource:
        """Drain the events; the terminal response."""
        async with contextlib.aclosing(self.batches()) as batches:
            async for _ in batches:
                pass
        return self.builder.response

    async def follow(self, starting_after: int | None = None) -> AsyncIterator[Emitted]:
        """The events so far (after sequence number ``starting_after``), then live ones
        until the terminal event, or until the turn ends without one. For turns driven
        by another task (background)."""
        index = 0 if starting_after is None else starting_after + 1
        while True:
            changed = self._changed
            while index < self._followable():
                yield self.emitted[index]
                index += 1
            if self.ended and index >= len(self.emitted):
                return
            await self._await_change(changed)

    def _followable(self) -> int:
        """How many events a follower may have: all but a terminal event whose end is
        not recorded yet (the turn has not ended): durable before it is sent, and
        replaced if it could not be recorded (:meth:`_fail_unrecorded`)."""
        return len(self.emitted) - (1 if self.finished and not self.ended else 0)

    async def open(self) -> None:
        """Record the response's start (store: true), the one step of a turn that can
        still fail before its first event (a chain deleted meanwhile, the store down).
        A transport calls it before it commits to a stream, so that such a failure is a
        plain HTTP error instead of a stream cut before ``response.created``; otherwise
        :meth:`events` does it. Idempotent. A turn opened this way must then be driven
        (:meth:`events`) or :meth:`discard`-ed.

        While other responses are in flight in this process (:class:`InFlight`), a
        stored stream waits up to :data:`ANSWERED_AT_ONCE_SECONDS` for its model, and
        one answered whole by then is recorded once, whole (:meth:`_record_whole`):
        under load the write saved is worth more than the start's early send. On an
        idle server its start is written at once, while the model works, so its first
        output is sent as soon as it comes."""
        if self._opened:
            return
        busy = self._enter()
        if not self._started_at:
            self._started_at = time.monotonic()
        try:
            if self.store is not None and not self._defer:
                self._start_pump()  # the model starts while the start is recorded
                if busy and self.builder.status is not ResponseStatus.QUEUED:
                    try:
                        whole = await self._answered_at_once()
                    except BaseException:  # the client left meanwhile: the model stops
                        await self._stop_pump()
                        raise
                    if whole:
                        await self._record_whole()
                        self._opened = True
                        return
            try:
                await self._record_begin()
            except BaseException:
                await self._stop_pump()
                raise
        except BaseException:
            self._leave()  # it never runs
            raise
        self._opened = True

    def _enter(self) -> bool:
        """Count this turn in flight (once); whether another one is."""
        counter = self._in_flight
        if counter is None:
            return False
        if not self._counted:
            self._counted = True
            counter.count += 1
        return counter.count > 1

    def _leave(self) -> None:
        if self._counted and self._in_flight is not None:
            self._counted = False
            self._in_flight.count -= 1

    async def _answered_at_once(self) -> bool:
        """Whether the model's whole answer is queued within
        :data:`ANSWERED_AT_ONCE_SECONDS`: the pump's first put (which a backend makes of
        its first output, its end, or its failure) ends the wait on the loop's next turn,
        once the pump has queued all that came with it; it has answered whole if it is
        then over. Nothing of the model's output is taken from the queue here."""
        pump = self._pump_task
        if pump is None:
            return False
        loop = asyncio.get_running_loop()
        self._first_put = waiter = loop.create_future()
        timer = loop.call_later(ANSWERED_AT_ONCE_SECONDS, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._first_put = None
        return pump.done() and not pump.cancelled()

    def _tell_first_put(self) -> None:
        waiter, self._first_put = self._first_put, None
        if waiter is not None:
            asyncio.get_running_loop().call_soon(_resolve, waiter)

    async def _record_whole(self) -> None:
        """A stored stream answered at once (:meth:`_answered_at_once`): its events are
        made from what is queued, and the response is recorded once, whole, with them
        (``store.record``, as a JSON answer is), before any of them is sent; they then
        leave as one batch. Nobody can know its id before then. A write that fails
        raises its error here, before the stream commits, as a start that cannot be
        recorded does; the turn is then over, with nothing sent."""
        builder = self.builder
        self.phase = TurnPhase.RUNNING
        self._defer = True
        await self._record_begin()  # deferred: kept for the record, nothing written
        queue = self._queue
        assert queue is not None
        batch = [self._emit(event) for event in builder.start()]
        while not builder.finished:
            got = self._control or queue.get_nowait()  # the pump is over: its end is queued
            batch += [self._emit(event) for event in self._next_events(got)]
        try:
            await self._write_end()
        except BaseException as exc:
            self.start_error = exc
            raise
        finally:
            self._mark_ended()
        self._whole = batch

    def _start_pump(self) -> None:
        """The queue and, unless a signal came first, the pump task (once)."""
        if self._queue is None:
            self._queue = Handoff(_QUEUE_SIZE)
            if self._control is None:
                self._pump_task = asyncio.create_task(self._pump(self._queue), name=f"backend-{self.id}")

    async def _stop_pump(self) -> None:
        """Cancel the pump, if any, and wait until it has closed the backend stream."""
        pump = self._pump_task
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    def defer_recording(self) -> None:
        """Record this response once, whole, when it ends (``store.record``: one
        transaction instead of two) instead of at its start too, and keep none of its
        events: nobody can follow it, and a plain JSON answer has no stream to resume
        (OpenAI's API too replays only the events of background responses). Only for a
        response nobody can see before it ends: a plain JSON answer, whose id is first
        given out with the response itself. Call before the turn runs."""
        self._defer = True
        self._unread()

    def unread(self) -> None:
        """Nobody will read this turn's events (a JSON answer that is not stored). Call
        before the turn runs."""
        if self.store is None:
            self._unread()

    def _unread(self) -> None:
        """Make and keep no events (every state machine of the builder still runs)."""
        self._serialize = False
        self.builder = self._builder(events=False)

    async def discard(self) -> None:
        """End a turn that was opened but never driven (its client left before the
        stream began) as a client leaving ends one: ``incomplete``, recorded. Nothing
        to do for a turn that ran or was never opened."""
        if not self._opened or self.phase is not TurnPhase.PREPARED:
            return
        batches = self.batches()
        with contextlib.suppress(StopAsyncIteration):
            await batches.__anext__()
        await batches.aclose()

    # ------------------------------------------------------------ storage

    async def _record_begin(self) -> None:
        if self._recording is not None:  # deferred: written with the end, by _record_end
            resource = self.builder.response
            await self._recording.begin(resource, None if self._defer else response_json(resource))

    async def _record_status(self) -> None:
        if self._recording is not None:
            resource = self.builder.response
            await self._recording.status(resource, response_json(resource))

    async def _settle(self) -> None:
        """Record the end (once) and mark the turn ended."""
        await self._record_end()
        self._mark_ended()

    async def _record_end(self) -> None:
        if self._recording is None or self._recording.end_written or not self.builder.finished:
            return
        try:
            await self._write_end()
        except Exception as exc:
            log.exception("could not record the end of response %s", self.id)
            self._unrecorded = exc if isinstance(exc, ORSError) else ServerError(
                "The server could not record this response.", code="store_error")

    async def _write_end(self) -> None:
        """Write the end (the whole response, if its start was not written); raises
        what the write raised."""
        assert self._recording is not None
        resource = self.builder.response
        await self._recording.end(resource, response_json(resource), self._kept_events())

    async def _record_later(self) -> None:
        """The end the client was told (the failure that replaced an unrecorded end, or
        an end that stayed), handed to the store to write once it can
        (:meth:`Recording.end_later`)."""
        if self._recording is not None:
            resource = self.builder.response
            await self._recording.end_later(resource, response_json(resource), self._kept_events())

    def _kept_events(self) -> list[str] | None:
        """The events to store with the end; ``None`` when nobody reads them."""
        return [emitted.data for emitted in self.emitted] if self._serialize else None

    def _fail_unrecorded(self, last: list[Emitted]) -> list[Emitted]:
        """The end was not recorded: a ``completed`` response's terminal event (the last
        of ``last``, not yet sent) is taken back and the response fails with the store's
        error instead (:meth:`ResponseBuilder.unrecorded`). An end that is not
        ``completed`` stays as it is (logged): a failed one failed anyway, and an
        ``incomplete`` one's items were closed so. Called before anything is awaited
        after the end, so no follower has seen that event (:meth:`follow` holds a
        terminal event back until the turn has ended)."""
        error = self._unrecorded
        assert error is not None
        if self.builder.status is not ResponseStatus.COMPLETED:
            return last
        if last:  # none when nobody reads the events
            terminal = last.pop()
            if self.emitted and self.emitted[-1] is terminal:
                self.emitted.pop()
        self.error = error
        return last + [self._emit(event) for event in self.builder.unrecorded(error)]
