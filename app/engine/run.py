"""Running one response: backend → guards → builder → events, recorded as its delivery says.

A :class:`Run` is made by :meth:`app.engine.engine.Engine.run` from a prepared request
(:meth:`~app.engine.engine.Engine.prepare` has done everything that can fail before a
stream) and a :class:`~app.engine.delivery.Delivery`. The transport then only reads it
(:meth:`Run.batches` for a stream, :meth:`Run.final` for a JSON answer,
:meth:`Run.follow` for a background run) and may signal it (:meth:`Run.cancel`,
:meth:`Run.interrupt`). The run owns everything else.

**Phases** (:class:`RunPhase`), never back: ``PREPARED`` (made) → ``STARTED`` (its
model runs; a stored stream's start is recorded) → ``RUNNING`` (its events are being
made) → ``ENDED`` (its outcome is final: the terminal event was made and recorded, or the
run failed before its first event, or it was closed before it ran). For SSE, WebSocket
and background deliveries the engine starts the run before handing it over, so a start
that cannot be recorded (the store out of reach, a chain deleted meanwhile) is an error
before any stream commits; a JSON run starts when it is driven.

**Events.** The first are ``response.created`` and ``response.in_progress`` (a background
response is ``queued`` first); the last is exactly one terminal event, whatever fails: a
backend error becomes ``error`` + ``response.failed``, an unexpected exception a
``server_error`` failure. They come in batches, each what exists at once: the start, or
every delta already queued when the reader asks (a transport writes a batch with one
send); a delta is never held back to wait for another. A JSON run makes no events.

**The model's output** comes through a :class:`~app.engine.feed.Feed`: a pump task and
a bounded queue (a slow reader slows the pump). The model starts before the start is
recorded, and what it makes meanwhile waits in the queue.

**Races.** A signal (cancel, interrupt) takes effect at once, even while nobody reads:
the pump is cancelled, which stops generation, and the next event the reader gets is the
end (``response.incomplete`` with status ``cancelled``, or ``response.failed``); the
first signal wins. A reader that stops reading (client gone, task cancelled) cancels the
pump; the response ends ``incomplete`` (``client_disconnected``) and that end is
recorded, shielded from the reader's cancellation. A run closed before it was driven
(:meth:`Run.aclose`) ends the same way.

**Recording** (``store: true``; what each write holds: :mod:`app.engine.recording`).
A JSON run is recorded once, whole, with its end, and keeps no events (nobody can know
its id before the answer). Every other run records its start before its first event,
and its end with its events before the terminal event is handed out: a client may fetch
or continue the response the moment it reads that event. Nothing is written per delta;
what came before the end is handed out before the end's write. An end that cannot be
recorded is not announced as ``completed``: the terminal event is taken back and the
response fails with the store's error, which the store is given to write later. A stored
run is registered with :class:`~app.engine.live.LiveRuns` from its start to its end, so
other requests find, follow and cancel it.

``on_end`` (the place a response holds among its tenant's responses) is awaited once,
however the run ends: before its terminal event is handed out, or when a failed start,
a reader gone or a close ends it. Waiters (:meth:`Run.wait_started`,
:meth:`Run.wait_ended`, :meth:`Run.follow`) are woken by events, never by polling.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from app.engine.builder import ResponseBuilder
from app.engine.delivery import Delivery
from app.engine.event_log import Emitted, EventLog
from app.engine.feed import DELTAS, END, Cancelled, Feed, Interrupted, Signal
from app.engine.recording import Recording
from app.errors import ModelError, ORSError, ServerError
from app.metrics import Metrics
from app.protocol.events import StreamEvent, serialize_event
from app.protocol.responses import ResponseResource
from app.protocol.states import ResponseStatus

if TYPE_CHECKING:
    from app.engine.engine import Prepared
    from app.engine.live import LiveRuns

log = logging.getLogger("ors.run")


class RunPhase(enum.Enum):
    PREPARED = "prepared"
    STARTED = "started"
    RUNNING = "running"
    ENDED = "ended"


class Run:
    """One response being produced (see the module docstring). It is read once
    (:meth:`batches` or :meth:`final`); a background run is read by its own task and
    observed with :meth:`follow`."""

    def __init__(self, prepared: Prepared, delivery: Delivery, *, metrics: Metrics, live: LiveRuns,
                 on_end: Callable[[], Awaitable[None]] | None = None) -> None:
        self.prepared = prepared
        self.delivery = delivery
        self.body = prepared.body
        self.tenant = prepared.tenant
        self.initial = prepared.initial
        self._metrics = metrics
        self._live = live
        self._on_end = on_end
        self.builder = ResponseBuilder(
            prepared.initial,
            error_events=delivery.error_events,
            seal_reasoning=prepared.seal_reasoning,
            logprobs=prepared.request.sampling.logprobs,
            offered=prepared.offered,
            events=delivery.streams,
            empty_message=prepared.generate,
        )
        self._feed = Feed(prepared.backend, prepared.request if delivery.streams else prepared.whole_request(),
                          name=f"backend-{self.id}", warm_only=not prepared.generate,
                          surface=prepared.surface, mcp=prepared.mcp)
        self.log = EventLog(keep=prepared.store is not None and delivery.streams)
        self._recording = None if prepared.store is None else Recording(
            prepared.store, tenant=self.tenant, response_id=self.id, tools=prepared.tools,
            input_items=prepared.input_items, on_recorded=prepared.on_recorded, conversation=prepared.conversation)
        self.phase = RunPhase.PREPARED
        self.error: ORSError | None = None
        """Why the response failed, when it failed with an error of ours."""
        self.start_error: BaseException | None = None
        """What ended the run before its first event, if anything did."""
        self._unrecorded: ORSError | None = None
        self._ended_once = False
        self._started_at = 0.0
        self._first_output_at: float | None = None

    @property
    def id(self) -> str:
        return self.initial.id

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.prepared.tools

    @property
    def input_items(self) -> list[dict[str, Any]]:
        """The request's input items in stored form, ids assigned (made once, when first
        asked for: a response neither stored nor continued never needs them)."""
        return self.prepared.input_items()

    @property
    def answer(self) -> str | None:
        """The final response's JSON once its end is recorded (made once: the store and
        a JSON answer share it); ``None`` for a run that is not stored."""
        return None if self._recording is None else self._recording.answer

    @property
    def response(self) -> ResponseResource:
        return self.builder.response

    @property
    def finished(self) -> bool:
        return self.builder.finished

    @property
    def ended(self) -> bool:
        return self.phase is RunPhase.ENDED

    # ------------------------------------------------------------ control

    def interrupt(self, error: ORSError) -> None:
        """End the run early with ``error`` (shutdown, the connection cap): its events end
        with ``response.failed``. From any task on the loop, any number of times; never
        blocks, never raises."""
        self._signal(Interrupted(error))

    def cancel(self) -> None:
        """Stop at the client's request: the response ends ``cancelled``. Like
        :meth:`interrupt`, it never blocks nor raises."""
        self._signal(Cancelled())

    def _signal(self, signal: Signal) -> None:
        if not self.finished and not self.ended:
            self._feed.signal(signal)

    # ------------------------------------------------------------ waiting

    async def wait_started(self) -> None:
        """Until the first event exists. If the run ended without one (its start could
        not be recorded, or it was closed before it ran), raise why, as an ORSError."""
        while not self.log.count:
            if self.ended:
                error = self.start_error
                if isinstance(error, ORSError):
                    raise error
                raise ServerError("The server could not start this response.")
            await self.log.changed()

    async def wait_ended(self) -> None:
        """Until the run's outcome is final (``ENDED``)."""
        while not self.ended:
            await self.log.changed()

    def follow(self, starting_after: int | None = None) -> AsyncIterator[Emitted]:
        """The events so far (after sequence number ``starting_after``), then live ones
        until the terminal event (handed out once recorded), or until the run ends
        without one. For a run read by another task (background)."""
        return self.log.follow(starting_after)

    # ------------------------------------------------------------ driving

    async def start(self) -> None:
        """``PREPARED`` → ``STARTED``: the model starts, then the start is recorded (a
        JSON run's is kept for its end). Raises what the start's write raised, after the
        model was stopped and the run ended. Called by the engine, or by the first read."""
        if self.phase is not RunPhase.PREPARED:
            return
        self.phase = RunPhase.STARTED
        self._started_at = time.monotonic()
        self._metrics.response_started()
        self._feed.start()
        try:
            await self._record_begin()
        except BaseException as exc:
            self.start_error = exc
            with anyio.CancelScope(shield=True):
                await self._feed.stop()
                await self._end(began=False)
            raise
        if self._recording is not None:
            self._live.add(self)

    async def final(self) -> ResponseResource:
        """Drive the run to its end (a JSON answer, a background run); the final response."""
        async with contextlib.aclosing(self.batches()) as batches:
            async for _ in batches:
                pass
        return self.builder.response

    async def aclose(self) -> None:
        """End a run that was started but never read (its client left before the stream
        began) as a reader leaving ends one: ``incomplete``, recorded. Nothing to do for a
        run that was read or has ended. Idempotent."""
        if self.phase is not RunPhase.STARTED:
            return
        with anyio.CancelScope(shield=True):
            batches = self.batches()
            with contextlib.suppress(StopAsyncIteration):
                await batches.__anext__()
            await batches.aclose()

    def abandon(self) -> None:
        """Mark a run whose driver never ran as ended (a task cancelled before its first
        step leaves nothing else to do it)."""
        if self.phase is RunPhase.PREPARED:
            self.phase = RunPhase.ENDED
            self.log.close()

    async def batches(self) -> AsyncGenerator[list[Emitted], None]:
        """Drive the run; its events in batches, each non-empty (see the module
        docstring). Each batch is in the log before it is handed out, so a reader
        leaving between batches never leaves a gap in the sequence numbers."""
        if self.phase not in (RunPhase.PREPARED, RunPhase.STARTED):
            raise RuntimeError(f"run {self.id} is read once")
        builder, feed = self.builder, self._feed
        began = False
        try:
            await self.start()
            self.phase = RunPhase.RUNNING
            began = True
            batch = self._emit(builder.start())
            if builder.status is ResponseStatus.QUEUED:
                yield batch
                batch = self._emit(builder.begin())
                await self._record_status()
            if feed.idle():
                if batch:
                    yield batch
                batch = []
            # else the model's output came while the start was recorded: it joins the
            # start's batch, as any output already queued joins a batch
            while not builder.finished:
                last = self._emit(self._events_of(await feed.next()))
                while not builder.finished and (queued := feed.ready()) is not None:
                    batch += last  # what is already queued joins this batch, never waited for
                    last = self._emit(self._events_of(queued))
                if builder.finished:
                    if batch and self._recording is not None:  # what came before the end does
                        yield batch                            # not wait for its write
                        batch = []
                    last = await self._settle(last)
                batch += last
                if batch:
                    yield batch
                batch = []
        finally:
            feed.cancel()
            if not self._ended_once or not feed.settled():  # else nothing to wait for: no shield
                with anyio.CancelScope(shield=True):  # the reader may be cancelled: this is not
                    await feed.stop()
                    if not self._ended_once:
                        if began and not builder.finished:
                            self._emit(builder.stop("client_disconnected"))
                            await self._record_end()
                        await self._end(began)

    def _events_of(self, got: object) -> list[StreamEvent]:
        builder = self.builder
        try:
            if isinstance(got, DELTAS):  # per token: the common case first
                if self._first_output_at is None:
                    self._first_output_at = time.monotonic()
                return builder.feed(got)
            if isinstance(got, Cancelled):
                return builder.cancel()
            if isinstance(got, Interrupted):
                raise got.error
            if isinstance(got, BaseException):
                raise got
            if got is END:
                raise ModelError("The model stream ended without a finish.", code="model_stream_ended")
            return []  # WAKE: a signal came, and is read next
        except ORSError as exc:
            self.error = exc
            # a client's error is not the server's fault: no warning, and never a traceback
            log.log(logging.INFO if exc.status < 500 else logging.WARNING, "response %s failed: %r", self.id, exc)
            return builder.fail(exc)
        except Exception:
            log.exception("response %s failed unexpectedly", self.id)
            self.error = ServerError("The server failed while generating this response.")
            return builder.fail(self.error)

    def _emit(self, events: list[StreamEvent]) -> list[Emitted]:
        made = [Emitted(event.type, serialize_event(event)) for event in events]
        self.log.extend(made)
        return made

    async def _settle(self, last: list[Emitted]) -> list[Emitted]:
        """The terminal event was made (the last of ``last``): record the end, then end
        the run. An end that could not be recorded replaces a ``completed`` terminal
        event with the store's failure (:meth:`ResponseBuilder.unrecorded`), before
        anyone was handed it, and is given to the store to write later."""
        await self._record_end()
        error = self._unrecorded
        if error is not None:
            if self.builder.status is ResponseStatus.COMPLETED:
                if last:
                    self.log.take_back(last.pop())
                self.error = error
                last = last + self._emit(self.builder.unrecorded(error))
            if self._recording is not None:
                await self._recording.end_later(self.builder.response, self.log.kept())
        await self._end(began=True)
        return last

    async def _end(self, began: bool) -> None:
        """Once: the run ends (waiters woken, metrics counted), then ``on_end``."""
        if self._ended_once:
            return
        self._close(began)
        if self._on_end is not None:
            await self._on_end()

    def _close(self, began: bool) -> None:
        self._ended_once = True
        self.phase = RunPhase.ENDED
        self._live.discard(self)
        self.log.close()
        self._metrics.response_left()
        if began:
            self._observe()

    def _observe(self) -> None:
        """What ``/metrics`` counts of a response that began."""
        response = self.builder.response
        usage = response.usage
        self._metrics.response_ended(
            model=self.prepared.request.model,
            status=str(response.status),
            error_code=response.error.code if response.error is not None else None,
            seconds=time.monotonic() - self._started_at,
            first_output_seconds=None if self._first_output_at is None else self._first_output_at - self._started_at,
            input_tokens=usage.input_tokens if usage else 0,
            output_tokens=usage.output_tokens if usage else 0,
            cached_tokens=usage.input_tokens_details.cached_tokens if usage else 0,
        )

    # ------------------------------------------------------------ recording

    async def _record_begin(self) -> None:
        if self._recording is not None:  # a JSON run's is kept, written with its end
            await self._recording.begin(self.builder.response, whole=not self.delivery.streams)

    async def _record_status(self) -> None:
        if self._recording is not None:
            await self._recording.status(self.builder.response)

    async def _record_end(self) -> None:
        """Write the end (once); a failure is logged and kept (``_unrecorded``)."""
        if self._recording is None or self._recording.end_written or not self.builder.finished:
            return
        try:
            await self._recording.end(self.builder.response, self.log.kept())
        except ORSError as exc:  # said to the client; a traceback only for what is not an ORSError
            log.log(logging.INFO if exc.status < 500 else logging.ERROR, "the end of response %s was not recorded: %r",
                    self.id, exc)
            self._unrecorded = exc
        except Exception:
            log.exception("could not record the end of response %s", self.id)
            self._unrecorded = ServerError("The server could not record this response.", code="store_error")
