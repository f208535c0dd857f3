"""Decoding a Responses upstream's stream (``POST /v1/responses``, ``stream: true``) into
normalized deltas.

The upstream's events are read for their meaning only; its ``sequence_number``s, its
snapshots and its ids are ignored (the builder makes the client's own), so whatever the
upstream gets wrong there never reaches the client. What is read:

    response.output_item.added           opens an item (by ``output_index``, else ``item_id``)
    response.output_text.delta           text (with logprobs when asked)
    response.refusal.delta               text (the delta vocabulary has no refusal)
    response.reasoning.delta             reasoning; OpenAI's ``response.reasoning_text.delta`` too
    response.reasoning_summary_text.delta reasoning, for an item that streams no raw reasoning
    response.function_call_arguments.delta  arguments, held (see below)
    response.output_item.done            the item's final form: reconciled (see below)
    response.completed / .incomplete     the final output (reconciled), usage, finish reason
    response.failed, error               raised (:mod:`app.backends.responses_errors`)

Everything else (``*.done`` text events, part events, extension events) is ignored: the
final items carry the same information.

**Streamed deltas against final items.** Text and reasoning go to the client as they
arrive. When an item's final form comes (its ``output_item.done``, or else the terminal
event's ``output``), its final text is compared with what was streamed for it:

* the same: nothing more;
* the streamed text is a prefix of the final one (deltas lost or never sent, or an
  upstream that sends only final items): the rest is sent, so the client gets the final
  text;
* anything else: the streamed text has already reached the client and cannot be taken
  back, so it stands (logged). An upstream known to do this is configured with the
  dialect option ``hold_text``: text and reasoning are then held until each item's final
  form and only that is sent, so the final items always win (at the cost of live text).

An upstream's tool search (``tool_search_call``, ``tool_search_output``: see
:mod:`app.backends.responses_upstream`) is read from its final items only, into a
``ToolSearchCallDelta`` and a ``ToolSearchOutputDelta`` (the names of the function tools
it loaded; other kinds of tools are dropped with a log line); a client-run search counts
as a call.

Function calls are always held until their final form, which wins (name, ``call_id``,
arguments): a call is short, useless to the client before it is whole, and the item a
tool call's correctness depends on. A final item of a kind the builder does not make
(another vendor's item types) is dropped with a log line. Consecutive message items
of the upstream become one message item of the client's response.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.backends.base import (
    Delta,
    Finish,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    ToolSearchCallDelta,
    ToolSearchOutputDelta,
    Usage,
)
from app.backends.chat_errors import json_object
from app.backends.chat_stream import _token_logprob
from app.backends.responses_errors import failed_response_error, stream_error
from app.errors import ModelError
from app.protocol.states import ItemType, ResponseStatus

logger = logging.getLogger("ors.upstream")

_TEXT_EVENTS = {"response.output_text.delta", "response.refusal.delta"}
_REASONING_EVENTS = {
    "response.reasoning.delta": "content",
    "response.reasoning_text.delta": "content",
    "response.reasoning_summary_text.delta": "summary",
}
_TERMINAL = {
    "response.completed": ResponseStatus.COMPLETED,
    "response.incomplete": ResponseStatus.INCOMPLETE,
    "response.failed": ResponseStatus.FAILED,
}
_INCOMPLETE: dict[str, FinishReason] = {"max_output_tokens": "length", "content_filter": "content_filter"}


@dataclass(slots=True)
class _Item:
    """One upstream output item, as far as it was streamed."""

    kind: str
    index: int | None = None
    """Its ``output_index``, once an event has said it."""
    item_id: str | None = None
    sent: list[str] = field(default_factory=list)
    """Text (or reasoning) already handed on."""
    source: str | None = None
    """For reasoning: ``content`` or ``summary``, whichever streamed first."""
    name: str | None = None
    call_id: str | None = None
    arguments: list[str] = field(default_factory=list)
    settled: bool = False


class ResponsesEventDecoder:
    """Turns one upstream Responses stream into deltas; see the module docstring.

    ``hold_text``: hand text and reasoning on only from final items. ``top_logprobs``:
    ``None`` when logprobs were not asked, else how many alternatives to keep. ``media``:
    an error's ``param`` about a part of the input, as the client's (``stream_error``).
    """

    def __init__(self, *, hold_text: bool = False, top_logprobs: int | None = None,
                 media: Callable[[str | None], str | None] | None = None) -> None:
        self.media = media
        self.hold_text = hold_text
        self.top_logprobs = top_logprobs
        self.received = False
        """Any event came (a broken connection before that may be retried)."""
        self.done = False
        self.reason: FinishReason | None = None
        self.usage: Usage | None = None
        self._items: dict[int, _Item] = {}
        self._by_id: dict[str, _Item] = {}
        self._order: list[_Item] = []
        self._calls = 0

    # -- input -------------------------------------------------------------------------------

    def feed_event(self, event: str, data: str) -> list[Delta]:
        """One SSE event. ``[DONE]`` before a terminal event means the stream was cut;
        anything after the terminal event is ignored."""
        self.received = True
        if self.done or data == "[DONE]" or not data.strip():
            return []
        payload = json_object(data)
        kind = payload.get("type") if isinstance(payload.get("type"), str) else event
        if kind == "error":
            raise stream_error(payload.get("error", payload), self.media)
        if kind in _TERMINAL:
            return self._terminal(_TERMINAL[kind], payload.get("response"))
        if kind == "response.output_item.added":
            self._item(payload, payload.get("item"))
            return []
        if kind == "response.output_item.done":
            item = payload.get("item")
            return self._settle(self._item(payload, item), item) if isinstance(item, dict) else []
        if kind in _TEXT_EVENTS:
            return self._text(self._item(payload, None, default=ItemType.MESSAGE), payload)
        if kind in _REASONING_EVENTS:
            thought = self._item(payload, None, default=ItemType.REASONING)
            return self._reasoning(thought, payload, _REASONING_EVENTS[kind])
        if kind == "response.function_call_arguments.delta":
            call = self._item(payload, None, default=ItemType.FUNCTION_CALL)
            if isinstance(payload.get("delta"), str):
                call.arguments.append(payload["delta"])
        return []

    def feed_events(self, events: Iterable[tuple[str, str]]) -> Iterator[Delta]:
        """:meth:`feed_event` for each of ``events``, in order."""
        for event, data in events:
            yield from self.feed_event(event, data)

    def feed_whole(self, body: bytes) -> list[Delta]:
        """A whole ``ResponseResource`` (an upstream that ignored ``stream: true``)."""
        self.received = True
        response = json_object(body)
        if isinstance(response.get("error"), dict) and response.get("status") != ResponseStatus.FAILED:
            raise stream_error(response["error"], self.media)
        return self._terminal(str(response.get("status") or ResponseStatus.COMPLETED), response)

    def finish(self) -> Finish:
        if not self.done:
            raise ModelError(
                "The upstream model server ended the stream before the model finished.",
                code="upstream_disconnected",
            )
        return Finish(reason=self.reason or "stop", usage=self.usage)

    # -- items -------------------------------------------------------------------------------

    def _item(self, payload: Mapping[str, Any], item: Any, default: str = ItemType.MESSAGE) -> _Item:
        """The item an event is about: by ``output_index``, else by item id, else the
        latest item of the right kind; a new one if none."""
        item_id = item.get("id") if isinstance(item, dict) else payload.get("item_id")
        item_id = item_id if isinstance(item_id, str) and item_id else None
        index = payload.get("output_index")
        index = index if isinstance(index, int) and not isinstance(index, bool) else None
        kind = item.get("type") if isinstance(item, dict) and isinstance(item.get("type"), str) else default
        found = self._items.get(index) if index is not None else None
        if found is None and item_id is not None:
            found = self._by_id.get(item_id)
        if found is None and index is None and item_id is None and self._order and self._order[-1].kind == kind:
            found = self._order[-1]
        if found is None:  # an item streamed with neither index nor id, now named
            found = next((item for item in self._order
                          if item.index is None and item.item_id is None and item.kind == kind and not item.settled),
                         None)
        if found is None:
            found = _Item(kind=kind, item_id=item_id)
            self._order.append(found)
        if index is not None and found.index is None:
            found.index = index
            self._items.setdefault(index, found)
        if item_id is not None and found.item_id is None:
            found.item_id = item_id
        if found.item_id is not None:
            self._by_id.setdefault(found.item_id, found)
        if isinstance(item, dict) and kind == ItemType.FUNCTION_CALL:
            found.name = found.name or _string(item.get("name"))
            found.call_id = found.call_id or _string(item.get("call_id"))
        return found

    def _text(self, item: _Item, payload: Mapping[str, Any]) -> list[Delta]:
        delta = payload.get("delta")
        if not isinstance(delta, str) or self.hold_text or item.settled:
            return []
        item.sent.append(delta)
        tokens = self._logprobs(payload.get("logprobs")) if self.top_logprobs is not None else ()
        return [TextDelta(delta, tokens)] if delta or tokens else []

    def _reasoning(self, item: _Item, payload: Mapping[str, Any], source: str) -> list[Delta]:
        delta = payload.get("delta")
        if not isinstance(delta, str) or not delta or self.hold_text or item.settled:
            return []
        if item.source not in (None, source):
            return []
        item.source = source
        item.sent.append(delta)
        return [ReasoningDelta(delta)]

    def _settle(self, item: _Item, final: Mapping[str, Any]) -> list[Delta]:
        """Reconcile ``item`` with its final form (see the module docstring)."""
        if item.settled:
            return []
        item.settled = True
        kind = final.get("type")
        if kind == ItemType.FUNCTION_CALL:
            return self._call(item, final)
        if kind in (ItemType.TOOL_SEARCH_CALL, ItemType.TOOL_SEARCH_OUTPUT):
            return [self._search(kind, final)]
        if kind == ItemType.MESSAGE:
            texts = _part_texts(final.get("content"), ("output_text", "refusal"))
            return self._complete(item, texts, TextDelta)
        if kind == ItemType.REASONING:
            content = _part_texts(final.get("content"), ("reasoning_text",))
            summary = _part_texts(final.get("summary"), ("summary_text",))
            return self._complete(item, summary if item.source == "summary" or not content else content,
                                  ReasoningDelta)
        logger.warning("dropped an upstream output item of type %r: this server does not stream it", kind)
        return []

    def _complete(self, item: _Item, final_texts: list[str] | None, make: type[Any]) -> list[Delta]:
        if final_texts is None:  # the final item says nothing usable: what was streamed stands
            return []
        text = "".join(final_texts)
        sent = "".join(item.sent)
        if text == sent:
            return []
        if text.startswith(sent):
            item.sent.append(text[len(sent):])
            return [make(text[len(sent):])]
        logger.warning("the upstream's final item %s differs from what it streamed; the streamed text stands "
                       "(set the dialect option hold_text for this upstream)", item.item_id)
        return []

    def _call(self, item: _Item, final: Mapping[str, Any]) -> list[Delta]:
        name = _string(final.get("name")) or item.name
        if name is None:
            raise ModelError("The upstream sent a function call without a name.", code="upstream_error")
        arguments = final.get("arguments")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, str):
            arguments = "".join(item.arguments)
        index, self._calls = self._calls, self._calls + 1
        call_id = _string(final.get("call_id")) or item.call_id
        return [ToolCallDelta(index=index, name=name, arguments=arguments, call_id=call_id)]

    def _search(self, kind: str, final: Mapping[str, Any]) -> ToolSearchCallDelta | ToolSearchOutputDelta:
        call_id = _string(final.get("call_id"))
        execution = "client" if final.get("execution") == "client" else "server"
        if kind == ItemType.TOOL_SEARCH_CALL:
            arguments = final.get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    arguments = {"query": arguments}
            if execution == "client":
                self._calls += 1
            return ToolSearchCallDelta(call_id, arguments if isinstance(arguments, dict) else {}, execution)
        names = []
        for tool in final.get("tools") if isinstance(final.get("tools"), list) else ():
            name = tool.get("name") if isinstance(tool, dict) and tool.get("type") == "function" else None
            if isinstance(name, str):
                names.append(name)
            else:
                logger.warning("dropped a tool the upstream's tool search loaded: only function tools are read")
        return ToolSearchOutputDelta(call_id, tuple(names), execution)

    # -- the end -----------------------------------------------------------------------------

    def _terminal(self, status: str, response: Any) -> list[Delta]:
        response = response if isinstance(response, dict) else {}
        status = response.get("status") if isinstance(response.get("status"), str) else status
        if status == ResponseStatus.FAILED:
            raise failed_response_error(response.get("error"))
        deltas: list[Delta] = []
        output = response.get("output")
        for position, final in enumerate(output if isinstance(output, list) else ()):
            if isinstance(final, dict):
                item = self._item({"output_index": position}, final)
                deltas += self._settle(item, final)
        for item in self._order:  # streamed items the final output left out
            if not item.settled and item.kind == ItemType.FUNCTION_CALL:
                deltas += self._settle(item, {"type": ItemType.FUNCTION_CALL})
        self.usage = _usage(response.get("usage"))
        if status == ResponseStatus.INCOMPLETE:
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            self.reason = _INCOMPLETE.get(reason if isinstance(reason, str) else "", "length")
        else:
            self.reason = "tool_calls" if self._calls else "stop"
        self.done = True
        return deltas

    def _logprobs(self, raw: Any) -> tuple[TokenLogprob, ...]:
        entries = raw if isinstance(raw, list) else ()
        parsed = (_token_logprob(entry, self.top_logprobs or 0) for entry in entries)
        return tuple(token for token in parsed if token is not None)


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _part_texts(parts: Any, kinds: tuple[str, ...]) -> list[str] | None:
    """The texts of the parts of these kinds, or ``None`` when ``parts`` is not a list."""
    if not isinstance(parts, list):
        return None
    texts = []
    for part in parts:
        if isinstance(part, dict) and part.get("type") in kinds:
            text = part.get("refusal") if part.get("type") == "refusal" else part.get("text")
            if isinstance(text, str):
                texts.append(text)
    return texts


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    inputs = raw.get("input_tokens_details") if isinstance(raw.get("input_tokens_details"), dict) else {}
    outputs = raw.get("output_tokens_details") if isinstance(raw.get("output_tokens_details"), dict) else {}
    return Usage(
        input_tokens=_count(raw.get("input_tokens")),
        output_tokens=_count(raw.get("output_tokens")),
        cached_tokens=_count(inputs.get("cached_tokens")),
        reasoning_tokens=_count(outputs.get("reasoning_tokens")),
    )
