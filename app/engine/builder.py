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
that goes into ``response.output``.

Logprobs, only when the request asked for them (``logprobs=True``): each
``response.output_text.delta`` carries the logprobs of the tokens of its delta (the
``TextDelta``'s, possibly none), and ``response.output_text.done``, ``content_part.done``
and the final ``output_text`` part carry the whole list of the message, in order. Logprobs
that arrive with no text (a token that completes no character) go with the next delta.
When not asked, no ``logprobs`` field appears anywhere and nothing is done per delta.

A builder whose events nobody will read (:meth:`ResponseBuilder.quiet`: a plain JSON
answer) runs every state machine, gives every id and sequence number and builds every
item and snapshot of the response as any other, but each event it returns is an
:class:`Unread` stand-in, its type and sequence number only, not its wire model (and the
zero-value items of ``*.added`` events are not made): about half of the pydantic models a
JSON answer made were events that were dropped unread.

The event made per token, a text or reasoning delta without logprobs, is a
:class:`TextDeltaEvent`: its fields, and its JSON written from them in the shape its wire
model (:class:`~app.protocol.events.OutputTextDelta`, ``ReasoningDelta``) serializes to,
which a test holds it to for any text. Making and dumping the validated model took 2.9 µs
a token, the stand-in 0.4 µs. Every other event is a :class:`WireEvent`: its kind (the
wire model's class) and fields, its JSON written field by field in the model's order by
pydantic-core (each nested item, part or error by its own model), the model's rule for
fields left out when ``None`` applied. Its fields come from the builder's own validated
state (items, parts, snapshots), so validating them again as an event model checked
nothing; making and dumping an ``output_item.added`` took 3.2 µs as a model, 0.9 µs so.
A test holds every kind the builder makes, over random lives of a builder, to the JSON
of its validated model (:meth:`WireEvent.wire`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic_core import to_json

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
from app.errors import ORSError
from app.protocol.content import LogProb, OutputText, ReasoningText, TopLogProb
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
from app.protocol.items import CustomToolCall, FunctionCall, Message, OutputItem, Reasoning
from app.protocol.responses import (
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    ResponseError,
    ResponseResource,
    Usage,
)
from app.protocol.states import ItemStatus, ItemType, ResponseStatus
from app.protocol.tools import CUSTOM_INPUT, OfferedFunction


class IllegalTransition(RuntimeError):
    """A state machine was asked to make a move the spec forbids."""


class Unread(NamedTuple):
    """An event of a quiet builder: what it is and where it stands, nothing more."""

    type: str
    sequence_number: int


class TextDeltaEvent(NamedTuple):
    """A text or reasoning delta without logprobs, and its JSON (see the module
    docstring): what the wire model of its ``type`` serializes to, the text escaped by
    pydantic-core as every event's is (a lone surrogate raises as it does there). A
    named tuple: made once a token, without a ``__setattr__`` a field."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str

    def model_dump_json(self) -> str:
        return (f'{{"type":"{self.type}","sequence_number":{self.sequence_number},'
                f'"item_id":{to_json(self.item_id).decode()},"output_index":{self.output_index},'
                f'"content_index":{self.content_index},"delta":{to_json(self.delta).decode()}}}')


class WireEvent:
    """An event made without its wire model: its kind (the wire model's class), its
    fields, and the JSON that model writes of them (see the module docstring). Fields
    read as attributes (``event.response``); :meth:`wire` makes the validated model."""

    __slots__ = ("kind", "type", "sequence_number", "fields")

    def __init__(self, kind: type[StreamEvent], fields: dict[str, Any]) -> None:
        self.kind = kind
        self.type = _TYPES[kind]
        self.sequence_number: int = fields["sequence_number"]
        self.fields = fields

    def __getattr__(self, name: str) -> Any:
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def model_dump_json(self) -> str:
        return _shape(self.kind).dump(self.fields)

    def wire(self) -> StreamEvent:
        return self.kind(**self.fields)


_REQUIRED = object()


class _Shape:
    """How the wire model of one event kind writes its JSON: its fields in order (a
    default for one not given; left out when ``None`` if its model leaves it out,
    ``WireModel.omit_if_none``), written by pydantic-core in one call, each nested item,
    part or error by its own model's serializer."""

    __slots__ = ("fields",)

    def __init__(self, kind: type[StreamEvent]) -> None:
        fields = []
        for name, info in kind.model_fields.items():
            if (info.alias or name) != name or (info.serialization_alias or name) != name:
                raise TypeError(f"{kind.__name__}.{name} has an alias: its JSON cannot be written without the model")
            default = _REQUIRED if info.is_required() else info.get_default(call_default_factory=True)
            fields.append((name, default, name in kind.omit_if_none))
        self.fields = tuple(fields)

    def dump(self, values: dict[str, Any]) -> str:
        ordered = {}
        for name, default, omit in self.fields:
            value = values.get(name, default)
            if value is _REQUIRED:
                raise TypeError(f"the event lacks its field {name!r}")
            if value is None and omit:
                continue
            ordered[name] = value
        return to_json(ordered).decode()


_SHAPES: dict[type[StreamEvent], _Shape] = {}


def _shape(kind: type[StreamEvent]) -> _Shape:
    shape = _SHAPES.get(kind)
    if shape is None:
        shape = _SHAPES[kind] = _Shape(kind)
    return shape


Event = StreamEvent | Unread | TextDeltaEvent | WireEvent
"""What the builder's methods return: wire events, a quiet builder's stand-ins, or the
deltas of text made without a wire model."""

_TYPES: dict[type[StreamEvent], str] = {
    kind: kind.model_fields["type"].default
    for kind in (ContentPartAdded, ContentPartDone, ErrorEvent, FunctionCallArgumentsDelta,
                 FunctionCallArgumentsDone, OutputItemAdded, OutputItemDone, OutputTextDelta,
                 OutputTextDone, ReasoningDone, ReasoningDeltaEvent, ResponseCompleted,
                 ResponseCreated, ResponseFailed, ResponseIncomplete, ResponseInProgress,
                 ResponseQueued)
}


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


@dataclass(slots=True)
class _OpenItem:
    """The item being streamed: its kind, position, id and accumulated text."""

    kind: ItemType  # a message, a call (function or custom), or reasoning
    output_index: int
    item_id: str
    chunks: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    namespace: str | None = None
    custom: bool = False
    """A call of a ``custom`` tool: a ``custom_tool_call`` item, its input streamed by no event."""
    tool_index: int = -1
    logprobs: list[LogProb] = field(default_factory=list)
    """Of a message, when asked: the logprobs of the streamed text so far."""
    held_logprobs: list[LogProb] = field(default_factory=list)
    """Logprobs that came with no text, for the next delta."""


class ResponseBuilder:
    """Builds one response. Not thread-safe; one instance per response.

    Every public method returns the events it caused, in order, already numbered.
    ``response`` is always a valid ``ResponseResource`` for the current state.
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
        events (the spec has none for it) between its ``output_item`` events."""
        if response.status.final or response.output:
            raise IllegalTransition("a response starts queued or in_progress, with no output")
        self._response = response
        self._error_events = error_events
        self._seal_reasoning = seal_reasoning
        self._clock = clock
        self._logprobs = logprobs
        self._offered = offered or {}
        self._sequence = 0
        self._output: list[OutputItem] = []
        self._open: _OpenItem | None = None
        self._closed_tool_indexes: set[int] = set()
        self._started = False
        self._quiet = False

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

    def _next(self) -> int:
        """The next event's sequence number, given as the event is made (setting it on
        a made event cost one more pydantic ``__setattr__`` per event)."""
        number = self._sequence
        self._sequence += 1
        return number

    def quiet(self) -> None:
        """Nobody will read this response's events (see the module docstring): from now
        on each is an :class:`Unread` stand-in. Before :meth:`start` only."""
        if self._started:
            raise IllegalTransition("a started response's events are already out")
        self._quiet = True

    def _event(self, kind: type[StreamEvent], /, **fields: Any) -> Event:
        """The event ``kind`` of ``fields`` (a :class:`WireEvent`), or for a quiet builder
        its stand-in."""
        if self._quiet:
            return Unread(_TYPES[kind], fields["sequence_number"])
        return WireEvent(kind, fields)

    def _unread(self, *kinds: type[StreamEvent]) -> list[Event]:
        """A quiet builder's stand-ins for the events ``kinds``, numbered in order."""
        return [Unread(_TYPES[kind], self._next()) for kind in kinds]

    def _move(self, status: ResponseStatus, **changes: object) -> None:
        allowed = _RESPONSE_MOVES.get(self._response.status, frozenset())
        if status not in allowed:
            raise IllegalTransition(f"response cannot move from {self._response.status} to {status}")
        self._response = self._response.model_copy(update={"status": status, **changes})

    # ------------------------------------------------------------ lifecycle

    def start(self) -> list[Event]:
        """``response.created`` (and ``response.queued`` for a queued response), then
        ``response.in_progress`` unless the response is queued."""
        if self._started:
            raise IllegalTransition("response already started")
        self._started = True
        events = [self._event(ResponseCreated, sequence_number=self._next(), response=self._response)]
        if self._response.status is ResponseStatus.QUEUED:
            events.append(self._event(ResponseQueued, sequence_number=self._next(), response=self._response))
        else:
            events.append(self._event(ResponseInProgress, sequence_number=self._next(), response=self._response))
        return events

    def begin(self) -> list[Event]:
        """A queued response starts running: ``response.in_progress``."""
        self._require_running(queued_ok=True)
        self._move(ResponseStatus.IN_PROGRESS)
        return [self._event(ResponseInProgress, sequence_number=self._next(), response=self._response)]

    def _require_running(self, *, queued_ok: bool = False) -> None:
        if not self._started:
            raise IllegalTransition("response not started")
        if self._response.status is ResponseStatus.QUEUED and queued_ok:
            return
        if self._response.status is not ResponseStatus.IN_PROGRESS:
            raise IllegalTransition(f"response is {self._response.status}, not in_progress")

    # ------------------------------------------------------------ deltas

    def feed(self, delta: Delta) -> list[Event]:
        """Apply one backend delta. ``Finish`` ends the response (see :meth:`finish`)."""
        if isinstance(delta, TextDelta):
            return self._text(delta)
        if isinstance(delta, ToolCallDelta):
            return self._tool_call(delta)
        if isinstance(delta, ReasoningDelta):
            return self._reasoning(delta.text)
        if isinstance(delta, Finish):
            return self.finish(delta.reason, delta.usage)
        raise TypeError(f"not a delta: {delta!r}")

    def _text(self, delta: TextDelta) -> list[Event]:
        if not self._logprobs:
            return self._stream_text(ItemType.MESSAGE, self._open_message, OutputTextDelta, delta.text)
        return self._stream_text(ItemType.MESSAGE, self._open_message, OutputTextDelta, delta.text, delta.logprobs)

    def _reasoning(self, text: str) -> list[Event]:
        return self._stream_text(ItemType.REASONING, self._open_reasoning, ReasoningDeltaEvent, text)

    def _stream_text(
        self,
        kind: ItemType,
        open_item: Callable[[], list[Event]],
        delta_event: type[OutputTextDelta] | type[ReasoningDeltaEvent],
        text: str,
        logprobs: Sequence[TokenLogprob] | None = None,
    ) -> list[Event]:
        """Append ``text`` to the open item of ``kind`` (its content part 0), opening one
        first (and closing any other) when needed. ``logprobs`` (a message's, only when
        asked) go on the delta event and into the item's list."""
        self._require_running()
        events: list[Event] = []
        item = self._open
        if item is None or item.kind != kind:
            events += self._close_open(ItemStatus.COMPLETED)
            events += open_item()
            item = self._open
            assert item is not None
        extra: dict[str, list[LogProb]] = {}
        if logprobs is not None:
            item.held_logprobs += _wire_logprobs(logprobs)
            if text:
                carried, item.held_logprobs = item.held_logprobs, []
                item.logprobs += carried
                extra["logprobs"] = carried
        if text:
            item.chunks.append(text)
            if not extra and not self._quiet:  # per token: no wire model made (module docstring)
                events.append(TextDeltaEvent(_TYPES[delta_event], self._next(), item.item_id, item.output_index, 0,
                                             text))
                return events
            events.append(self._event(
                delta_event,
                sequence_number=self._next(),
                item_id=item.item_id,
                output_index=item.output_index,
                content_index=0,
                delta=text,
                **extra,
            ))
        return events

    def _tool_call(self, delta: ToolCallDelta) -> list[Event]:
        self._require_running()
        events: list[Event] = []
        item = self._open
        if item is None or item.kind is not ItemType.FUNCTION_CALL or item.tool_index != delta.index:
            if delta.index in self._closed_tool_indexes:
                raise IllegalTransition(f"tool call {delta.index} continued after it was closed")
            if not delta.name:
                raise IllegalTransition(f"tool call {delta.index} started without a name")
            events += self._close_open(ItemStatus.COMPLETED)
            events += self._open_function_call(delta.index, delta.name)
            item = self._open
            assert item is not None
        if delta.arguments:
            item.chunks.append(delta.arguments)
            if item.custom:
                return events
            events.append(self._event(
                FunctionCallArgumentsDelta,
                sequence_number=self._next(),
                item_id=item.item_id,
                output_index=item.output_index,
                delta=delta.arguments,
            ))
        return events

    # ------------------------------------------------------------ opening items

    def _next_index(self) -> int:
        return len(self._output)

    def _open_message(self) -> list[Event]:
        item = _OpenItem(ItemType.MESSAGE, self._next_index(), ids.message_id())
        self._open = item
        if self._quiet:
            return self._unread(OutputItemAdded, ContentPartAdded)
        return [
            self._event(OutputItemAdded, sequence_number=self._next(), output_index=item.output_index,
                        item=Message(id=item.item_id, status=ItemStatus.IN_PROGRESS, role="assistant", content=[])),
            self._event(ContentPartAdded, sequence_number=self._next(), item_id=item.item_id,
                        output_index=item.output_index, content_index=0,
                        part=OutputText(text="", logprobs=[] if self._logprobs else None)),
        ]

    def _open_function_call(self, tool_index: int, name: str) -> list[Event]:
        offered = self._offered.get(name)
        custom = offered is not None and offered.custom
        item = _OpenItem(
            ItemType.FUNCTION_CALL,
            self._next_index(),
            ids.custom_tool_call_id() if custom else ids.function_call_id(),
            call_id=ids.call_id(),
            name=offered.function if offered is not None else name,
            namespace=offered.namespace_name if offered is not None else None,
            custom=custom,
            tool_index=tool_index,
        )
        self._open = item
        if self._quiet:
            return self._unread(OutputItemAdded)
        return [self._event(OutputItemAdded, sequence_number=self._next(), output_index=item.output_index,
                            item=_call_item(item, "", ItemStatus.IN_PROGRESS))]

    def _open_reasoning(self) -> list[Event]:
        item = _OpenItem(ItemType.REASONING, self._next_index(), ids.reasoning_id())
        self._open = item
        if self._quiet:
            return self._unread(OutputItemAdded, ContentPartAdded)
        return [
            self._event(OutputItemAdded, sequence_number=self._next(), output_index=item.output_index,
                        item=Reasoning(id=item.item_id, summary=[], status=ItemStatus.IN_PROGRESS)),
            self._event(ContentPartAdded, sequence_number=self._next(), item_id=item.item_id,
                        output_index=item.output_index, content_index=0, part=ReasoningText(text="")),
        ]

    # ------------------------------------------------------------ closing items

    def _close_open(self, status: ItemStatus) -> list[Event]:
        item = self._open
        if item is None:
            return []
        self._open = None
        text = "".join(item.chunks)
        if item.kind is ItemType.MESSAGE:
            return self._close_message(item, text, status)
        if item.kind is ItemType.FUNCTION_CALL:
            self._closed_tool_indexes.add(item.tool_index)
            return self._close_function_call(item, text, status)
        return self._close_reasoning(item, text, status)

    def _close_message(self, item: _OpenItem, text: str, status: ItemStatus) -> list[Event]:
        part = self._output_text(item, text)
        final = Message(id=item.item_id, status=status, role="assistant", content=[part])
        self._output.append(final)
        common = {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}
        return [
            self._event(OutputTextDone, sequence_number=self._next(), text=text, logprobs=part.logprobs, **common),  # type: ignore[arg-type]
            self._event(ContentPartDone, sequence_number=self._next(), part=part, **common),  # type: ignore[arg-type]
            self._event(OutputItemDone, sequence_number=self._next(), output_index=item.output_index, item=final),
        ]

    def _output_text(self, item: _OpenItem, text: str) -> OutputText:
        """A message's final part; logprobs that never got text are left out."""
        return OutputText(text=text, logprobs=list(item.logprobs) if self._logprobs else None)

    def _close_function_call(self, item: _OpenItem, arguments: str, status: ItemStatus) -> list[Event]:
        final = _call_item(item, arguments, status)
        self._output.append(final)
        if item.custom:
            return [self._event(OutputItemDone, sequence_number=self._next(), output_index=item.output_index,
                                item=final)]
        return [
            self._event(
                FunctionCallArgumentsDone,
                sequence_number=self._next(), item_id=item.item_id, output_index=item.output_index, arguments=arguments
            ),
            self._event(OutputItemDone, sequence_number=self._next(), output_index=item.output_index, item=final),
        ]

    def _close_reasoning(self, item: _OpenItem, text: str, status: ItemStatus) -> list[Event]:
        part = ReasoningText(text=text)
        sealed = self._seal_reasoning(text) if self._seal_reasoning is not None else None
        final = Reasoning(
            id=item.item_id,
            summary=[],
            content=[part],
            encrypted_content=sealed,
            status=status,
        )
        self._output.append(final)
        common = {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}
        return [
            self._event(ReasoningDone, sequence_number=self._next(), text=text, **common),  # type: ignore[arg-type]
            self._event(ContentPartDone, sequence_number=self._next(), part=part, **common),  # type: ignore[arg-type]
            self._event(OutputItemDone, sequence_number=self._next(), output_index=item.output_index, item=final),
        ]

    # ------------------------------------------------------------ terminal events

    def finish(self, reason: FinishReason, usage: BackendUsage | None = None) -> list[Event]:
        """The backend finished. ``length`` and ``content_filter`` close the open item as
        ``incomplete`` and end the response ``incomplete``; anything else completes it.
        A response that produced nothing still gets one (empty) assistant message, so
        clients can rely on a message with ``output_text``."""
        incomplete_reason = _INCOMPLETE_REASONS.get(reason)
        if incomplete_reason:
            return self.stop(incomplete_reason, usage)
        self._require_running()
        events: list[Event] = []
        if self._open is None and not self._output:
            events += self._open_message()
        events += self._close_open(ItemStatus.COMPLETED)
        self._move(ResponseStatus.COMPLETED, output=list(self._output), usage=_usage(usage),
                   completed_at=int(self._clock()))
        events.append(self._event(ResponseCompleted, sequence_number=self._next(), response=self._response))
        return events

    def stop(self, reason: str, usage: BackendUsage | None = None, *,
             status: ResponseStatus = ResponseStatus.INCOMPLETE) -> list[Event]:
        """End early: the open item is closed ``incomplete`` and the response ends with
        ``response.incomplete`` carrying ``incomplete_details.reason``. ``status`` is
        ``incomplete``, or ``cancelled`` for a response stopped at the client's request
        (a documented superset status; its terminal event is still ``response.incomplete``)."""
        self._require_running(queued_ok=True)
        events = self._close_open(ItemStatus.INCOMPLETE)
        self._move(
            status,
            output=list(self._output),
            usage=_usage(usage),
            # a cancelled response is not "incomplete": its details stay null, as OpenAI's do
            incomplete_details=IncompleteDetails(reason=reason) if status is ResponseStatus.INCOMPLETE else None,
        )
        events.append(self._event(ResponseIncomplete, sequence_number=self._next(), response=self._response))
        return events

    def fail(self, error: ORSError, usage: BackendUsage | None = None) -> list[Event]:
        """The response failed after it started: the ``error`` event (unless disabled),
        then ``response.failed``. An item that was still streaming is not closed with
        events (only a budget stop may close an item ``incomplete``); it appears in the
        failed response's output with status ``incomplete``, so nothing half-written is
        ever marked completed and nothing streamed is lost."""
        if not self._started:
            raise IllegalTransition("a response that never started cannot fail with events")
        events: list[Event] = []
        partial = self._abandon_open()
        if self._error_events:
            events.append(self._event(ErrorEvent, sequence_number=self._next(), error=ErrorPayload(**error.payload())))
        self._move(
            ResponseStatus.FAILED,
            output=[*self._output, *partial],
            usage=_usage(usage),
            error=ResponseError(**error.response_error()),
        )
        events.append(self._event(ResponseFailed, sequence_number=self._next(), response=self._response))
        return events

    def unrecorded(self, error: ORSError) -> list[Event]:
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
        self._sequence -= 1
        events: list[Event] = []
        if self._error_events:
            events.append(self._event(ErrorEvent, sequence_number=self._next(), error=ErrorPayload(**error.payload())))
        self._response = self._response.model_copy(update={
            "status": ResponseStatus.FAILED, "error": ResponseError(**error.response_error()), "completed_at": None,
        })
        events.append(self._event(ResponseFailed, sequence_number=self._next(), response=self._response))
        return events

    def _abandon_open(self) -> list[OutputItem]:
        """The open item as an ``incomplete`` wire item, without events."""
        item = self._open
        if item is None:
            return []
        self._open = None
        text = "".join(item.chunks)
        if item.kind is ItemType.MESSAGE:
            part = self._output_text(item, text)
            return [Message(id=item.item_id, status=ItemStatus.INCOMPLETE, role="assistant", content=[part])]
        if item.kind is ItemType.FUNCTION_CALL:
            return [_call_item(item, text, ItemStatus.INCOMPLETE)]
        return [Reasoning(id=item.item_id, summary=[], content=[ReasoningText(text=text)],
                          status=ItemStatus.INCOMPLETE)]

    def cancel(self) -> list[Event]:
        """Stop at the client's request (background cancel): ``cancelled``."""
        return self.stop("cancelled", status=ResponseStatus.CANCELLED)


_FLOOR = -9999.0
"""The logprob reported for a token the model deems impossible (JSON has no -inf)."""


def _wire_logprobs(tokens: Sequence[TokenLogprob]) -> list[LogProb]:
    return [
        LogProb(
            token=token.token,
            logprob=_finite(token.logprob),
            bytes=list(token.token_bytes),
            top_logprobs=[
                TopLogProb(token=top.token, logprob=_finite(top.logprob), bytes=list(top.token_bytes))
                for top in token.top
            ],
        )
        for token in tokens
    ]


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else _FLOOR


_NONE_CACHED = InputTokensDetails(cached_tokens=0)
_NO_REASONING_TOKENS = OutputTokensDetails(reasoning_tokens=0)
"""The details of most usages: one each for every response (wire objects are never
changed once made)."""


def _usage(usage: BackendUsage | None) -> Usage | None:
    if usage is None:
        return None
    cached, reasoning = usage.cached_tokens, usage.reasoning_tokens
    return Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        total_tokens=usage.input_tokens + usage.output_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=cached) if cached else _NONE_CACHED,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning) if reasoning else _NO_REASONING_TOKENS,
    )


def _call_item(item: _OpenItem, arguments: str, status: ItemStatus) -> FunctionCall | CustomToolCall:
    """The wire item of a call: a ``function_call``, or a ``custom_tool_call`` whose
    input is the one argument (as written so far, when the call was cut short)."""
    if item.custom:
        return CustomToolCall(id=item.item_id, call_id=item.call_id, name=item.name,
                              input=_custom_input(arguments), status=status)
    return FunctionCall(id=item.item_id, call_id=item.call_id, name=item.name, arguments=arguments,
                        status=status, namespace=item.namespace)


def _custom_input(arguments: str) -> str:
    if not arguments:
        return ""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments  # cut short: the text as far as it got
    text = value.get(CUSTOM_INPUT) if isinstance(value, dict) else None
    return text if isinstance(text, str) else arguments
