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
that goes into ``response.output`` (the items themselves: :mod:`app.engine.output_items`).

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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.backends.base import (
    Delta,
    Finish,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
)
from app.backends.base import Usage as BackendUsage
from app.engine import ids
from app.engine.output_items import (
    OpenItem,
    added_item,
    added_part,
    call_item,
    message,
    output_text,
    reasoning,
    wire_logprobs,
    wire_usage,
)
from app.errors import ORSError
from app.protocol.content import ReasoningText
from app.protocol.events import (
    ContentPartAdded,
    ContentPartDone,
    ErrorEvent,
    ErrorPayload,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ReasoningDone,
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


class IllegalTransition(RuntimeError):
    """A state machine was asked to make a move the spec forbids."""


_RESPONSE_MOVES: dict[ResponseStatus, frozenset[ResponseStatus]] = {
    ResponseStatus.QUEUED: frozenset({ResponseStatus.IN_PROGRESS, ResponseStatus.CANCELLED, ResponseStatus.FAILED,
                                      ResponseStatus.INCOMPLETE}),
    ResponseStatus.IN_PROGRESS: frozenset({ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE,
                                           ResponseStatus.FAILED, ResponseStatus.CANCELLED}),
}

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
        events (the spec has none for it) between its ``output_item`` events.
        ``events=False``: nobody reads the events (see the module docstring)."""
        if response.status.final or response.output:
            raise IllegalTransition("a response starts queued or in_progress, with no output")
        self._response = response
        self._error_events = error_events
        self._seal_reasoning = seal_reasoning
        self._clock = clock
        self._logprobs = logprobs
        self._offered = offered or {}
        self._emits = events
        self._sequence = 0
        self._made: list[StreamEvent] = []
        """The events of the public call in progress (:meth:`_take` hands them out)."""
        self._output: list[OutputItem] = []
        self._open: OpenItem | None = None
        self._closed_tool_indexes: set[int] = set()
        self._started = False

    # ------------------------------------------------------------ state

    @property
    def response(self) -> ResponseResource:
        return self._response

    @property
    def status(self) -> ResponseStatus:
        return self._response.status

    @property
    def output(self) -> list[OutputItem]:
        """The closed output items so far (the open one is not included)."""
        return list(self._output)

    @property
    def finished(self) -> bool:
        return self._response.status.final

    def _add(self, kind: type[StreamEvent], /, **fields: Any) -> None:
        """Make the event ``kind`` of ``fields``, numbered next (none if nobody reads them)."""
        if self._emits:
            self._made.append(kind(sequence_number=self._next(), **fields))

    def _next(self) -> int:
        number = self._sequence
        self._sequence += 1
        return number

    def _take(self) -> list[StreamEvent]:
        made, self._made = self._made, []
        return made

    def _move(self, status: ResponseStatus, **changes: object) -> None:
        allowed = _RESPONSE_MOVES.get(self._response.status, frozenset())
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
        self._add(ResponseCreated, response=self._response)
        if self._response.status is ResponseStatus.QUEUED:
            self._add(ResponseQueued, response=self._response)
        else:
            self._add(ResponseInProgress, response=self._response)
        return self._take()

    def begin(self) -> list[StreamEvent]:
        """A queued response starts running: ``response.in_progress``."""
        self._require_running(queued_ok=True)
        self._move(ResponseStatus.IN_PROGRESS)
        self._add(ResponseInProgress, response=self._response)
        return self._take()

    def _require_running(self, *, queued_ok: bool = False) -> None:
        if not self._started:
            raise IllegalTransition("response not started")
        if self._response.status is ResponseStatus.QUEUED and queued_ok:
            return
        if self._response.status is not ResponseStatus.IN_PROGRESS:
            raise IllegalTransition(f"response is {self._response.status}, not in_progress")

    # ------------------------------------------------------------ deltas

    def feed(self, delta: Delta) -> list[StreamEvent]:
        """Apply one backend delta. ``Finish`` ends the response (see :meth:`finish`)."""
        if isinstance(delta, TextDelta):
            self._text(delta)
        elif isinstance(delta, ToolCallDelta):
            self._tool_call(delta)
        elif isinstance(delta, ReasoningDelta):
            self._stream_text(ItemType.REASONING, ReasoningDeltaEvent, delta.text)
        elif isinstance(delta, Finish):
            return self.finish(delta.reason, delta.usage)
        else:
            raise TypeError(f"not a delta: {delta!r}")
        return self._take()

    def _text(self, delta: TextDelta) -> None:
        if not self._logprobs:
            self._stream_text(ItemType.MESSAGE, OutputTextDelta, delta.text)
        else:
            self._stream_text(ItemType.MESSAGE, OutputTextDelta, delta.text, delta.logprobs)

    def _stream_text(
        self,
        kind: ItemType,
        delta_event: type[OutputTextDelta] | type[ReasoningDeltaEvent],
        text: str,
        logprobs: Sequence[TokenLogprob] | None = None,
    ) -> None:
        """Append ``text`` to the open item of ``kind`` (its content part 0), opening one
        first (and closing any other) when needed. ``logprobs`` (a message's, only when
        asked) go on the delta event and into the item's list."""
        self._require_running()
        item = self._open
        if item is None or item.kind is not kind:
            self._close_open(ItemStatus.COMPLETED)
            item = self._open_text(kind)
        if logprobs is None:
            if text:
                item.chunks.append(text)
                self._add(delta_event, item_id=item.item_id, output_index=item.output_index, content_index=0,
                          delta=text)
            return
        item.held_logprobs += wire_logprobs(logprobs)
        if text:
            carried, item.held_logprobs = item.held_logprobs, []
            item.logprobs += carried
            item.chunks.append(text)
            self._add(delta_event, item_id=item.item_id, output_index=item.output_index, content_index=0,
                      delta=text, logprobs=carried)

    def _tool_call(self, delta: ToolCallDelta) -> None:
        self._require_running()
        item = self._open
        if item is None or item.kind is not ItemType.FUNCTION_CALL or item.tool_index != delta.index:
            if delta.index in self._closed_tool_indexes:
                raise IllegalTransition(f"tool call {delta.index} continued after it was closed")
            if not delta.name:
                raise IllegalTransition(f"tool call {delta.index} started without a name")
            self._close_open(ItemStatus.COMPLETED)
            item = self._open_function_call(delta.index, delta.name)
        if delta.arguments:
            item.chunks.append(delta.arguments)
            if not item.custom:
                self._add(FunctionCallArgumentsDelta, item_id=item.item_id, output_index=item.output_index,
                          delta=delta.arguments)

    # ------------------------------------------------------------ opening items

    def _open_text(self, kind: ItemType) -> OpenItem:
        """Open a message or a reasoning item: ``output_item.added``, ``content_part.added``."""
        item_id = ids.message_id() if kind is ItemType.MESSAGE else ids.reasoning_id()
        item = self._open = OpenItem(kind, len(self._output), item_id)
        if self._emits:
            self._add(OutputItemAdded, output_index=item.output_index, item=added_item(item))
            self._add(ContentPartAdded, item_id=item.item_id, output_index=item.output_index, content_index=0,
                      part=added_part(item, logprobs=self._logprobs))
        return item

    def _open_function_call(self, tool_index: int, name: str) -> OpenItem:
        offered = self._offered.get(name)
        custom = offered is not None and offered.custom
        item = self._open = OpenItem(
            ItemType.FUNCTION_CALL,
            len(self._output),
            ids.custom_tool_call_id() if custom else ids.function_call_id(),
            call_id=ids.call_id(),
            name=offered.function if offered is not None else name,
            namespace=offered.namespace_name if offered is not None else None,
            custom=custom,
            tool_index=tool_index,
        )
        if self._emits:
            self._add(OutputItemAdded, output_index=item.output_index, item=added_item(item))
        return item

    # ------------------------------------------------------------ closing items

    def _close_open(self, status: ItemStatus) -> None:
        item = self._open
        if item is None:
            return
        self._open = None
        if item.kind is ItemType.MESSAGE:
            self._close_message(item, status)
        elif item.kind is ItemType.FUNCTION_CALL:
            self._closed_tool_indexes.add(item.tool_index)
            self._close_function_call(item, status)
        else:
            self._close_reasoning(item, status)

    def _close_message(self, item: OpenItem, status: ItemStatus) -> None:
        part = output_text(item, logprobs=self._logprobs)
        final = message(item, part, status)
        self._output.append(final)
        self._add(OutputTextDone, item_id=item.item_id, output_index=item.output_index, content_index=0,
                  text=part.text, logprobs=part.logprobs)
        self._add(ContentPartDone, item_id=item.item_id, output_index=item.output_index, content_index=0, part=part)
        self._add(OutputItemDone, output_index=item.output_index, item=final)

    def _close_function_call(self, item: OpenItem, status: ItemStatus) -> None:
        arguments = item.text
        final = call_item(item, arguments, status)
        self._output.append(final)
        if not item.custom:
            self._add(FunctionCallArgumentsDone, item_id=item.item_id, output_index=item.output_index,
                      arguments=arguments)
        self._add(OutputItemDone, output_index=item.output_index, item=final)

    def _close_reasoning(self, item: OpenItem, status: ItemStatus) -> None:
        part = ReasoningText(text=item.text)
        sealed = self._seal_reasoning(part.text) if self._seal_reasoning is not None else None
        final = reasoning(item, part, status, sealed)
        self._output.append(final)
        self._add(ReasoningDone, item_id=item.item_id, output_index=item.output_index, content_index=0,
                  text=part.text)
        self._add(ContentPartDone, item_id=item.item_id, output_index=item.output_index, content_index=0, part=part)
        self._add(OutputItemDone, output_index=item.output_index, item=final)

    # ------------------------------------------------------------ terminal events

    def finish(self, reason: FinishReason, usage: BackendUsage | None = None) -> list[StreamEvent]:
        """The backend finished. ``length`` and ``content_filter`` close the open item as
        ``incomplete`` and end the response ``incomplete``; anything else completes it.
        A response that produced nothing still gets one (empty) assistant message, so
        clients can rely on a message with ``output_text``."""
        incomplete_reason = _INCOMPLETE_REASONS.get(reason)
        if incomplete_reason:
            return self.stop(incomplete_reason, usage)
        self._require_running()
        if self._open is None and not self._output:
            self._open_text(ItemType.MESSAGE)
        self._close_open(ItemStatus.COMPLETED)
        self._move(ResponseStatus.COMPLETED, output=list(self._output), usage=wire_usage(usage),
                   completed_at=int(self._clock()))
        self._add(ResponseCompleted, response=self._response)
        return self._take()

    def stop(self, reason: str, usage: BackendUsage | None = None, *,
             status: ResponseStatus = ResponseStatus.INCOMPLETE) -> list[StreamEvent]:
        """End early: the open item is closed ``incomplete`` and the response ends with
        ``response.incomplete`` carrying ``incomplete_details.reason``. ``status`` is
        ``incomplete``, or ``cancelled`` for a response stopped at the client's request
        (a documented superset status; its terminal event is still ``response.incomplete``)."""
        self._require_running(queued_ok=True)
        self._close_open(ItemStatus.INCOMPLETE)
        self._move(
            status,
            output=list(self._output),
            usage=wire_usage(usage),
            # a cancelled response is not "incomplete": its details stay null, as OpenAI's do
            incomplete_details=IncompleteDetails(reason=reason) if status is ResponseStatus.INCOMPLETE else None,
        )
        self._add(ResponseIncomplete, response=self._response)
        return self._take()

    def fail(self, error: ORSError, usage: BackendUsage | None = None) -> list[StreamEvent]:
        """The response failed after it started: the ``error`` event (unless disabled),
        then ``response.failed``. An item that was still streaming is not closed with
        events (only a budget stop may close an item ``incomplete``); it appears in the
        failed response's output with status ``incomplete``, so nothing half-written is
        ever marked completed and nothing streamed is lost."""
        if not self._started:
            raise IllegalTransition("a response that never started cannot fail with events")
        partial = self._abandon_open()
        if self._error_events:
            self._add(ErrorEvent, error=ErrorPayload(**error.payload()))
        self._move(
            ResponseStatus.FAILED,
            output=[*self._output, *partial],
            usage=wire_usage(usage),
            error=ResponseError(**error.response_error()),
        )
        self._add(ResponseFailed, response=self._response)
        return self._take()

    def unrecorded(self, error: ORSError) -> list[StreamEvent]:
        """The end of a ``completed`` response could not be recorded, and its terminal
        event was not sent: that event is taken back (its sequence number is given
        again), and the response fails with ``error`` instead (the ``error`` event unless
        disabled, then ``response.failed``), its output as it was. The one move out of an
        ended state, for an end nobody has seen: a response is durable before its
        terminal event is sent, so one that is not must not be announced as completed.
        An ``incomplete`` (or ``cancelled``) end is not taken back: its items were closed
        ``incomplete``, which only ``response.incomplete`` may follow."""
        if self._response.status is not ResponseStatus.COMPLETED:
            raise IllegalTransition(f"a {self._response.status} response's end is not taken back")
        if self._emits:
            self._sequence -= 1
        if self._error_events:
            self._add(ErrorEvent, error=ErrorPayload(**error.payload()))
        self._response = self._response.model_copy(update={
            "status": ResponseStatus.FAILED, "error": ResponseError(**error.response_error()), "completed_at": None,
        })
        self._add(ResponseFailed, response=self._response)
        return self._take()

    def _abandon_open(self) -> list[OutputItem]:
        """The open item as an ``incomplete`` wire item, without events."""
        item = self._open
        if item is None:
            return []
        self._open = None
        if item.kind is ItemType.MESSAGE:
            return [message(item, output_text(item, logprobs=self._logprobs), ItemStatus.INCOMPLETE)]
        if item.kind is ItemType.FUNCTION_CALL:
            return [call_item(item, item.text, ItemStatus.INCOMPLETE)]
        return [reasoning(item, ReasoningText(text=item.text), ItemStatus.INCOMPLETE)]

    def cancel(self) -> list[StreamEvent]:
        """Stop at the client's request (background cancel): ``cancelled``."""
        return self.stop("cancelled", status=ResponseStatus.CANCELLED)
