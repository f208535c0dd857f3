"""The output items of a response as the builder makes them, and their events.

:class:`OutputItems` streams the items of one response one after the other: it opens
the item a delta needs (closing the one before), appends what the deltas carry, and
closes or abandons the open one when the response ends; each step makes its events
(``output_item.added``, ``content_part.added``, the deltas, the ``*.done`` events)
through the response's :class:`EventMaker`, which numbers them. :class:`OpenItem` is
the item being streamed; the functions below make its wire forms (the zero-value item
and part of the ``*.added`` events, the final item of ``output_item.done`` and
``response.output``) and convert what a backend reports (token logprobs, usage) into
wire objects. Wire objects are never changed once made, so the shared ones here
(:data:`NO_CACHED_TOKENS`, ...) serve every response.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.backends.base import TokenLogprob, ToolCallDelta, ToolSearchCallDelta, ToolSearchOutputDelta
from app.backends.base import Usage as BackendUsage
from app.engine import ids
from app.engine.mcp_items import McpDelta, McpItems
from app.engine.tool_search import loadable
from app.protocol.content import LogProb, OutputText, ReasoningText, StreamablePart, TopLogProb
from app.protocol.events import (
    ContentPartAdded,
    ContentPartDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ReasoningDelta,
    ReasoningDone,
    StreamEvent,
)
from app.protocol.items import (
    Compaction,
    CustomToolCall,
    FunctionCall,
    Message,
    OutputItem,
    Reasoning,
    ToolSearchCall,
    ToolSearchOutput,
)
from app.protocol.responses import InputTokensDetails, OutputTokensDetails, Usage
from app.protocol.states import ItemStatus, ItemType
from app.protocol.tools import CUSTOM_INPUT, OfferedFunction


class IllegalTransition(RuntimeError):
    """A state machine was asked to make a move the spec forbids."""


class EventMaker:
    """The events of one response, numbered as they are made (``sequence_number``);
    none at all when nobody reads them (``emits`` off)."""

    __slots__ = ("emits", "sequence", "made")

    def __init__(self, *, emits: bool) -> None:
        self.emits = emits
        self.sequence = 0
        self.made: list[StreamEvent] = []

    def add(self, kind: type[StreamEvent], /, **fields: Any) -> None:
        """Make the event ``kind`` of ``fields``, numbered next (nothing if not ``emits``)."""
        if self.emits:
            self.made.append(kind(sequence_number=self.sequence, **fields))
            self.sequence += 1

    def take(self) -> list[StreamEvent]:
        """The events made since the last take."""
        made, self.made = self.made, []
        return made


@dataclass(slots=True)
class OpenItem:
    """The item being streamed: its kind, position, id and accumulated text."""

    kind: ItemType
    """``message``, ``function_call`` (a function's or a custom tool's call) or ``reasoning``."""
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

    @property
    def text(self) -> str:
        return "".join(self.chunks)


def added_item(item: OpenItem) -> OutputItem:
    """The zero-value item of ``output_item.added``."""
    if item.kind is ItemType.MESSAGE:
        return Message(id=item.item_id, status=ItemStatus.IN_PROGRESS, role="assistant", content=[])
    if item.kind is ItemType.FUNCTION_CALL:
        return call_item(item, "", ItemStatus.IN_PROGRESS)
    return Reasoning(id=item.item_id, summary=[], status=ItemStatus.IN_PROGRESS)


def added_part(item: OpenItem, *, logprobs: bool) -> StreamablePart:
    """The zero-value part of ``content_part.added`` (a message's or reasoning's)."""
    if item.kind is ItemType.MESSAGE:
        return OutputText(text="", logprobs=[] if logprobs else None)
    return ReasoningText(text="")


def output_text(item: OpenItem, *, logprobs: bool) -> OutputText:
    """A message's final part; logprobs that never got text are left out."""
    return OutputText(text=item.text, logprobs=list(item.logprobs) if logprobs else None)


def message(item: OpenItem, part: OutputText, status: ItemStatus) -> Message:
    return Message(id=item.item_id, status=status, role="assistant", content=[part])


def reasoning(item: OpenItem, part: ReasoningText, status: ItemStatus, sealed: str | None = None) -> Reasoning:
    return Reasoning(id=item.item_id, summary=[], content=[part], encrypted_content=sealed, status=status)


def call_item(item: OpenItem, arguments: str, status: ItemStatus) -> FunctionCall | CustomToolCall:
    """The wire item of a call: a ``function_call``, or a ``custom_tool_call`` whose
    input is the one argument (as written so far, when the call was cut short)."""
    if item.custom:
        return CustomToolCall(id=item.item_id, call_id=item.call_id, name=item.name,
                              input=custom_input(arguments), status=status)
    return FunctionCall(id=item.item_id, call_id=item.call_id, name=item.name, arguments=arguments,
                        status=status, namespace=item.namespace)


def custom_input(arguments: str) -> str:
    """A custom tool's input: the one argument of the call the model made, or the text
    as far as it got when the call was cut short."""
    if not arguments:
        return ""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    text = value.get(CUSTOM_INPUT) if isinstance(value, dict) else None
    return text if isinstance(text, str) else arguments


FLOOR_LOGPROB = -9999.0
"""The logprob reported for a token the model deems impossible (JSON has no -inf)."""


def wire_logprobs(tokens: Sequence[TokenLogprob]) -> list[LogProb]:
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
    return logprob if math.isfinite(logprob) else FLOOR_LOGPROB


NO_CACHED_TOKENS = InputTokensDetails(cached_tokens=0)
NO_REASONING_TOKENS = OutputTokensDetails(reasoning_tokens=0)
"""The details of most usages, shared by every response."""


def wire_usage(usage: BackendUsage | None) -> Usage | None:
    if usage is None:
        return None
    cached, reasoning_tokens = usage.cached_tokens, usage.reasoning_tokens
    return Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        total_tokens=usage.input_tokens + usage.output_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=cached) if cached else NO_CACHED_TOKENS,
        output_tokens_details=(OutputTokensDetails(reasoning_tokens=reasoning_tokens) if reasoning_tokens
                               else NO_REASONING_TOKENS),
    )


class OutputItems:
    """The output items of one response as they stream (see the module docstring). Not
    thread-safe; the builder's."""

    def __init__(self, events: EventMaker, *, logprobs: bool, offered: Mapping[str, OfferedFunction],
                 seal_reasoning: Callable[[str], str] | None) -> None:
        self._events = events
        self._logprobs = logprobs
        self._offered = offered
        self._seal_reasoning = seal_reasoning
        self.closed: list[OutputItem] = []
        """The closed items, in order (the open one is not included)."""
        self._open: OpenItem | None = None
        self._closed_tool_indexes: set[int] = set()
        self._mcp = McpItems(events, self.closed)

    @property
    def empty(self) -> bool:
        """Whether no item was opened yet."""
        return self._open is None and not self.closed and not self._mcp.open

    def text(self, kind: ItemType, delta_event: type[OutputTextDelta] | type[ReasoningDelta], text: str,
             logprobs: Sequence[TokenLogprob] | None = None) -> None:
        """Append ``text`` to the open item of ``kind`` (a message's or reasoning's
        content part 0), opening one first (and closing any other) when needed.
        ``logprobs`` (a message's, only when asked) go on the delta event and into the
        item's list; those that came with no text wait for the next delta."""
        item = self._open
        if item is None or item.kind is not kind:
            self.close_open(ItemStatus.COMPLETED)
            item = self.open_text(kind)
        if logprobs is None:
            if text:
                item.chunks.append(text)
                self._events.add(delta_event, item_id=item.item_id, output_index=item.output_index,
                                 content_index=0, delta=text)
            return
        item.held_logprobs += wire_logprobs(logprobs)
        if text:
            carried, item.held_logprobs = item.held_logprobs, []
            item.logprobs += carried
            item.chunks.append(text)
            self._events.add(delta_event, item_id=item.item_id, output_index=item.output_index, content_index=0,
                             delta=text, logprobs=carried)

    def tool_call(self, delta: ToolCallDelta) -> None:
        """A piece of the call ``delta.index``: it opens the call (closing the open item)
        when it is a new one; its arguments are streamed (not a custom tool's input)."""
        item = self._open
        if item is None or item.kind is not ItemType.FUNCTION_CALL or item.tool_index != delta.index:
            if delta.index in self._closed_tool_indexes:
                raise IllegalTransition(f"tool call {delta.index} continued after it was closed")
            if not delta.name:
                raise IllegalTransition(f"tool call {delta.index} started without a name")
            self.close_open(ItemStatus.COMPLETED)
            item = self._open_call(delta.index, delta.name)
        if delta.arguments:
            item.chunks.append(delta.arguments)
            if not item.custom:
                self._events.add(FunctionCallArgumentsDelta, item_id=item.item_id, output_index=item.output_index,
                                 delta=delta.arguments)

    def compaction(self, encrypted_content: str) -> None:
        """A whole ``compaction`` item (closing the open item first): ``output_item.added``
        with its zero value (``encrypted_content: ""``, ``in_progress``), then
        ``output_item.done`` with the sealed content, ``completed``. It has no deltas."""
        self.close_open(ItemStatus.COMPLETED)
        item_id, output_index = ids.compaction_id(), len(self.closed)
        if self._events.emits:
            self._events.add(OutputItemAdded, output_index=output_index,
                             item=Compaction(id=item_id, encrypted_content="", status=ItemStatus.IN_PROGRESS))
        final = Compaction(id=item_id, encrypted_content=encrypted_content, status=ItemStatus.COMPLETED)
        self.closed.append(final)
        self._events.add(OutputItemDone, output_index=output_index, item=final)

    def tool_search(self, delta: ToolSearchCallDelta | ToolSearchOutputDelta) -> None:
        """A whole ``tool_search_call`` or ``tool_search_output`` (closing the open item
        first): ``output_item.added`` with its zero value (``arguments: {}`` or
        ``tools: []``, ``in_progress``), then ``output_item.done``, ``completed``. A
        client-run search always has a ``call_id`` (its output will name it); an output's
        ``tools`` are the loaded functions as the request defined them."""
        self.close_open(ItemStatus.COMPLETED)
        output_index = len(self.closed)
        final: ToolSearchCall | ToolSearchOutput
        if isinstance(delta, ToolSearchCallDelta):
            call_id = delta.call_id or (ids.call_id() if delta.execution == "client" else None)
            fields = {"id": ids.tool_search_call_id(), "call_id": call_id, "execution": delta.execution}
            added: ToolSearchCall | ToolSearchOutput = ToolSearchCall(**fields, arguments={},
                                                                      status=ItemStatus.IN_PROGRESS)
            final = ToolSearchCall(**fields, arguments=delta.arguments, status=ItemStatus.COMPLETED)
        else:
            found = [self._offered[name] for name in delta.names if name in self._offered]
            fields = {"id": ids.tool_search_output_id(), "call_id": delta.call_id, "execution": delta.execution}
            added = ToolSearchOutput(**fields, tools=[], status=ItemStatus.IN_PROGRESS)
            final = ToolSearchOutput(**fields, tools=loadable(found), status=ItemStatus.COMPLETED)
        if self._events.emits:
            self._events.add(OutputItemAdded, output_index=output_index, item=added)
        self.closed.append(final)
        self._events.add(OutputItemDone, output_index=output_index, item=final)

    def mcp(self, delta: McpDelta) -> None:
        """An MCP item's step (closing the open item first): :class:`~app.engine.mcp_items.McpItems`."""
        if not self._mcp.open:
            self.close_open(ItemStatus.COMPLETED)
        self._mcp.feed(delta)

    def open_text(self, kind: ItemType) -> OpenItem:
        """Open a message or a reasoning item: ``output_item.added``, ``content_part.added``."""
        item_id = ids.message_id() if kind is ItemType.MESSAGE else ids.reasoning_id()
        item = self._open = OpenItem(kind, len(self.closed), item_id)
        if self._events.emits:
            self._events.add(OutputItemAdded, output_index=item.output_index, item=added_item(item))
            self._events.add(ContentPartAdded, item_id=item.item_id, output_index=item.output_index,
                             content_index=0, part=added_part(item, logprobs=self._logprobs))
        return item

    def _open_call(self, tool_index: int, name: str) -> OpenItem:
        offered = self._offered.get(name)
        custom = offered is not None and offered.custom
        item = self._open = OpenItem(
            ItemType.FUNCTION_CALL,
            len(self.closed),
            ids.custom_tool_call_id() if custom else ids.function_call_id(),
            call_id=ids.call_id(),
            name=offered.function if offered is not None else name,
            namespace=offered.namespace_name if offered is not None else None,
            custom=custom,
            tool_index=tool_index,
        )
        if self._events.emits:
            self._events.add(OutputItemAdded, output_index=item.output_index, item=added_item(item))
        return item

    def close_open(self, status: ItemStatus) -> None:
        """Close the open item, if any, with ``status``: its ``*.done`` events."""
        self._mcp.close()
        item = self._open
        if item is None:
            return
        self._open = None
        add = self._events.add
        if item.kind is ItemType.MESSAGE:
            part = output_text(item, logprobs=self._logprobs)
            final: OutputItem = message(item, part, status)
            add(OutputTextDone, item_id=item.item_id, output_index=item.output_index, content_index=0,
                text=part.text, logprobs=part.logprobs)
            add(ContentPartDone, item_id=item.item_id, output_index=item.output_index, content_index=0, part=part)
        elif item.kind is ItemType.FUNCTION_CALL:
            self._closed_tool_indexes.add(item.tool_index)
            final = call_item(item, item.text, status)
            if not item.custom:
                add(FunctionCallArgumentsDone, item_id=item.item_id, output_index=item.output_index,
                    arguments=item.text)
        else:
            reasoned = ReasoningText(text=item.text)
            sealed = self._seal_reasoning(reasoned.text) if self._seal_reasoning is not None else None
            final = reasoning(item, reasoned, status, sealed)
            add(ReasoningDone, item_id=item.item_id, output_index=item.output_index, content_index=0,
                text=reasoned.text)
            add(ContentPartDone, item_id=item.item_id, output_index=item.output_index, content_index=0,
                part=reasoned)
        self.closed.append(final)
        add(OutputItemDone, output_index=item.output_index, item=final)

    def abandon_open(self) -> list[OutputItem]:
        """The open item as an ``incomplete`` wire item, without events (none if none is open)."""
        item = self._open
        if item is None:
            return self._mcp.abandon()
        self._open = None
        if item.kind is ItemType.MESSAGE:
            return [message(item, output_text(item, logprobs=self._logprobs), ItemStatus.INCOMPLETE)]
        if item.kind is ItemType.FUNCTION_CALL:
            return [call_item(item, item.text, ItemStatus.INCOMPLETE)]
        return [reasoning(item, ReasoningText(text=item.text), ItemStatus.INCOMPLETE)]
