"""The one source of a response: backend deltas in, spec events and the final response out.

:class:`ResponseBuilder` owns the response state machine, the state machine of every
output item, the ids of items and calls, and the ``sequence_number`` counter. The SSE
stream, the WebSocket frames, the JSON response and the stored record are all derived
from what it returns, so the items in the terminal event are the streamed items by
construction.

Response states::

    queued ──> in_progress ──> completed | incomplete | failed
       └──────────┴─────────> cancelled   (a superset status: stopped by the client)

Item states::

    in_progress ──> completed | incomplete

Any other transition raises :class:`IllegalTransition` at once: it is a bug in the
engine, never a client error.

Items are streamed one after the other (``output_index`` 0, 1, 2 …): a delta of another
kind, or for another tool call, closes the open item before opening the next. Wire
objects are never mutated after they are handed out: ``output_item.added`` carries a
fresh zero-value item, and ``output_item.done`` the final one, which is the same object
that goes into ``response.output`` (the items and their events:
:mod:`app.engine.output_items`).

The events are the wire models of :mod:`app.protocol.events` (validated as they are
made), and become JSON only through :func:`app.protocol.events.serialize_event`.

Logprobs, only when the request asked for them (``logprobs=True``): each
``response.output_text.delta`` carries the logprobs of the tokens of its delta (the
``TextDelta``'s, possibly none), and ``response.output_text.done``, ``content_part.done``
and the final ``output_text`` part carry the whole list of the message, in order. Logprobs
that arrive with no text (a token that completes no character) go with the next delta.
When not asked, no ``logprobs`` field appears anywhere and nothing is done per delta.

A builder made with ``events=False`` is for a response whose events nobody reads (a
plain JSON answer): it runs every state machine, gives every id and builds every item and
snapshot of the response as any other, and its methods return no events.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from app.backends.base import (
    CompactionDelta,
    Delta,
    Finish,
    FinishReason,
    McpApprovalRequestDelta,
    McpCallDelta,
    McpListToolsDelta,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolSearchCallDelta,
    ToolSearchOutputDelta,
)
from app.backends.base import Usage as BackendUsage
from app.engine.output_items import EventMaker, IllegalTransition, OutputItems, wire_usage
from app.errors import ORSError
from app.protocol.events import (
    ErrorEvent,
    ErrorPayload,
    OutputTextDelta,
    ResponseCompleted,
    ResponseCreated,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseQueued,
    StreamEvent,
)
from app.protocol.events import ReasoningDelta as ReasoningDeltaEvent
from app.protocol.items import OutputItem
from app.protocol.responses import IncompleteDetails, ResponseError, ResponseResource
from app.protocol.states import ItemStatus, ItemType, ResponseStatus
from app.protocol.tools import OfferedFunction

__all__ = ["IllegalTransition", "ResponseBuilder"]

_RESPONSE_MOVES: dict[ResponseStatus, frozenset[ResponseStatus]] = {
    ResponseStatus.QUEUED: frozenset({ResponseStatus.IN_PROGRESS, ResponseStatus.CANCELLED, ResponseStatus.FAILED,
                                      ResponseStatus.INCOMPLETE}),
    ResponseStatus.IN_PROGRESS: frozenset({ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE,
                                           ResponseStatus.FAILED, ResponseStatus.CANCELLED}),
}

_OPEN = frozenset({ResponseStatus.QUEUED, ResponseStatus.IN_PROGRESS})

_INCOMPLETE_REASONS: dict[FinishReason, str] = {
    "length": "max_output_tokens",
    "content_filter": "content_filter",
}


class ResponseBuilder:
    """Builds one response. Not thread-safe; one instance per response.

    Every public method returns the events it caused, in order, already numbered (none
    for a builder made with ``events=False``). ``response`` is always a valid
    ``ResponseResource`` for the current state.
    """

    def __init__(
        self,
        response: ResponseResource,
        *,
        error_events: bool = True,
        seal_reasoning: Callable[[str], str] | None = None,
        clock: Callable[[], float] = time.time,
        logprobs: bool = False,
        offered: Mapping[str, OfferedFunction] | None = None,
        events: bool = True,
        empty_message: bool = True,
    ) -> None:
        """``response`` is the initial snapshot (status ``in_progress`` or ``queued``,
        empty output). ``error_events=False`` leaves the ``error`` event out before
        ``response.failed`` (the WebSocket rule). ``seal_reasoning`` turns reasoning text
        into ``encrypted_content`` when the client asked for it. ``logprobs``: the request
        asked for logprobs (``GenerationRequest.sampling.logprobs``); see the module
        docstring. ``offered`` maps the flat name a model calls a function by to what
        was offered under it: a namespace tool's function makes a ``function_call``
        with the function's own ``name`` and its ``namespace``; a custom tool makes a
        ``custom_tool_call`` whose ``input`` is the call's one argument, with no delta
        events (the spec has none for it) between its ``output_item`` events; a tool
        search's output names the functions it loaded by the names of this map.
        ``events=False``: nobody reads the events (see the module docstring).
        ``empty_message=False``: a response that produced nothing completes with no
        output at all (a warm-up, which asked for none)."""
        if response.status not in _OPEN or response.output:
            raise IllegalTransition("a response starts queued or in_progress, with no output")
        self._response = response
        self._error_events = error_events
        self._clock = clock
        self._logprobs = logprobs
        self._events = EventMaker(emits=events)
        self._empty_message = empty_message
        self._items = OutputItems(self._events, logprobs=logprobs, offered=offered or {},
                                  seal_reasoning=seal_reasoning)
        self._started = False

    # ------------------------------------------------------------ state

    @property
    def response(self) -> ResponseResource:
        return self._response

    @property
    def status(self) -> ResponseStatus:
        return ResponseStatus(self._response.status)

    @property
    def output(self) -> list[OutputItem]:
        """The closed output items so far (the open one is not included)."""
        return list(self._items.closed)

    @property
    def finished(self) -> bool:
        return self._response.status not in _OPEN

    def _move(self, status: ResponseStatus, **changes: object) -> None:
        allowed = _RESPONSE_MOVES.get(self.status, frozenset())
        if status not in allowed:
            raise IllegalTransition(f"response cannot move from {self._response.status} to {status}")
        self._response = self._response.model_copy(update={"status": status, **changes})

    # ------------------------------------------------------------ lifecycle

    def start(self) -> list[StreamEvent]:
        """``response.created`` (and ``response.queued`` for a queued response), then
        ``response.in_progress`` unless the response is queued."""
        if self._started:
            raise IllegalTransition("response already started")
        self._started = True
        self._events.add(ResponseCreated, response=self._response)
        if self._response.status == ResponseStatus.QUEUED:
            self._events.add(ResponseQueued, response=self._response)
        else:
            self._events.add(ResponseInProgress, response=self._response)
        return self._events.take()

    def begin(self) -> list[StreamEvent]:
        """A queued response starts running: ``response.in_progress``."""
        self._require_running(queued_ok=True)
        self._move(ResponseStatus.IN_PROGRESS)
        self._events.add(ResponseInProgress, response=self._response)
        return self._events.take()

    def _require_running(self, *, queued_ok: bool = False) -> None:
        if not self._started:
            raise IllegalTransition("response not started")
        if self._response.status == ResponseStatus.QUEUED and queued_ok:
            return
        if self._response.status != ResponseStatus.IN_PROGRESS:
            raise IllegalTransition(f"response is {self._response.status}, not in_progress")

    def feed(self, delta: Delta) -> list[StreamEvent]:
        """Apply one backend delta. ``Finish`` ends the response (see :meth:`finish`)."""
        if isinstance(delta, Finish):
            return self.finish(delta.reason, delta.usage)
        self._require_running()
        if isinstance(delta, TextDelta):
            if self._logprobs:
                self._items.text(ItemType.MESSAGE, OutputTextDelta, delta.text, delta.logprobs)
            else:
                self._items.text(ItemType.MESSAGE, OutputTextDelta, delta.text)
        elif isinstance(delta, ReasoningDelta):
            self._items.text(ItemType.REASONING, ReasoningDeltaEvent, delta.text)
        elif isinstance(delta, ToolCallDelta):
            self._items.tool_call(delta)
        elif isinstance(delta, ToolSearchCallDelta | ToolSearchOutputDelta):
            self._items.tool_search(delta)
        elif isinstance(delta, McpListToolsDelta | McpCallDelta | McpApprovalRequestDelta):
            self._items.mcp(delta)
        elif isinstance(delta, CompactionDelta):
            self._items.compaction(delta.encrypted_content)
        else:
            raise TypeError(f"not a delta: {delta!r}")
        return self._events.take()

    # ------------------------------------------------------------ terminal events

    def finish(self, reason: FinishReason, usage: BackendUsage | None = None) -> list[StreamEvent]:
        """The backend finished. ``length`` and ``content_filter`` close the open item as
        ``incomplete`` and end the response ``incomplete``; anything else completes it.
        A response that produced nothing still gets one (empty) assistant message, so
        clients can rely on a message with ``output_text`` (unless ``empty_message`` is
        off)."""
        incomplete_reason = _INCOMPLETE_REASONS.get(reason)
        if incomplete_reason:
            return self.stop(incomplete_reason, usage)
        self._require_running()
        if self._items.empty and self._empty_message:
            self._items.open_text(ItemType.MESSAGE)
        self._items.close_open(ItemStatus.COMPLETED)
        self._move(ResponseStatus.COMPLETED, output=list(self._items.closed), usage=wire_usage(usage),
                   completed_at=int(self._clock()))
        self._events.add(ResponseCompleted, response=self._response)
        return self._events.take()

    def stop(self, reason: str, usage: BackendUsage | None = None, *,
             status: ResponseStatus = ResponseStatus.INCOMPLETE) -> list[StreamEvent]:
        """End early: the open item is closed ``incomplete`` and the response ends with
        ``response.incomplete`` carrying ``incomplete_details.reason``. ``status`` is
        ``incomplete``, or ``cancelled`` for a response stopped at the client's request
        (a documented superset status; its terminal event is still ``response.incomplete``)."""
        self._require_running(queued_ok=True)
        self._items.close_open(ItemStatus.INCOMPLETE)
        self._move(
            status,
            output=list(self._items.closed),
            usage=wire_usage(usage),
            # a cancelled response is not "incomplete": its details stay null, as OpenAI's do
            incomplete_details=IncompleteDetails(reason=reason) if status is ResponseStatus.INCOMPLETE else None,
        )
        self._events.add(ResponseIncomplete, response=self._response)
        return self._events.take()

    def fail(self, error: ORSError, usage: BackendUsage | None = None) -> list[StreamEvent]:
        """The response failed after it started: the ``error`` event (unless disabled),
        then ``response.failed``. An item that was still streaming is not closed with
        events (only a budget stop may close an item ``incomplete``); it appears in the
        failed response's output with status ``incomplete``, so nothing half-written is
        ever marked completed and nothing streamed is lost."""
        if not self._started:
            raise IllegalTransition("a response that never started cannot fail with events")
        partial = self._items.abandon_open()
        if self._error_events:
            self._events.add(ErrorEvent, error=ErrorPayload(**error.payload()))
        self._move(
            ResponseStatus.FAILED,
            output=[*self._items.closed, *partial],
            usage=wire_usage(usage),
            error=ResponseError(**error.response_error()),
        )
        self._events.add(ResponseFailed, response=self._response)
        return self._events.take()

    def unrecorded(self, error: ORSError) -> list[StreamEvent]:
        """The end of a ``completed`` response could not be recorded, and its terminal
        event was not sent: that event is taken back (its sequence number is given
        again), and the response fails with ``error`` instead (the ``error`` event unless
        disabled, then ``response.failed``), its output as it was. The one move out of an
        ended state, for an end nobody has seen: a response is durable before its
        terminal event is sent, so one that is not must not be announced as completed.
        An ``incomplete`` (or ``cancelled``) end is not taken back: its items were closed
        ``incomplete``, which only ``response.incomplete`` may follow."""
        if self._response.status != ResponseStatus.COMPLETED:
            raise IllegalTransition(f"a {self._response.status} response's end is not taken back")
        if self._events.emits:
            self._events.sequence -= 1
        if self._error_events:
            self._events.add(ErrorEvent, error=ErrorPayload(**error.payload()))
        self._response = self._response.model_copy(update={
            "status": ResponseStatus.FAILED, "error": ResponseError(**error.response_error()), "completed_at": None,
        })
        self._events.add(ResponseFailed, response=self._response)
        return self._events.take()

    def cancel(self) -> list[StreamEvent]:
        """Stop at the client's request (background cancel): ``cancelled``."""
        return self.stop("cancelled", status=ResponseStatus.CANCELLED)
