"""The output items of a response as the builder makes them.

:class:`OpenItem` is the item being streamed (its kind, position, ids and what it has
accumulated); the functions here make its wire forms: the zero-value item and part that
``output_item.added`` and ``content_part.added`` carry, and the final item that
``output_item.done`` carries and ``response.output`` holds. They also convert what a
backend reports (token logprobs, usage) into wire objects. Wire objects are never changed
once made, so the shared ones here (:data:`NO_CACHED_TOKENS`, ...) serve every response.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.backends.base import TokenLogprob
from app.backends.base import Usage as BackendUsage
from app.protocol.content import LogProb, OutputText, ReasoningText, StreamablePart, TopLogProb
from app.protocol.items import CustomToolCall, FunctionCall, Message, OutputItem, Reasoning
from app.protocol.responses import InputTokensDetails, OutputTokensDetails, Usage
from app.protocol.states import ItemStatus, ItemType
from app.protocol.tools import CUSTOM_INPUT


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
