"""The 24 streaming events. SSE and WebSocket carry exactly these objects.

Every event has ``type`` and a ``sequence_number`` that the engine's builder assigns.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import Field

from app.protocol.base import WireModel
from app.protocol.content import LogProb, StreamablePart, SummaryText, UrlCitation
from app.protocol.items import OutputItem
from app.protocol.responses import ResponseResource, response_json


class StreamEvent(WireModel):
    type: str
    sequence_number: int


# ---------------------------------------------------------------- response state


class ResponseCreated(StreamEvent):
    type: Literal["response.created"] = "response.created"
    response: ResponseResource


class ResponseQueued(StreamEvent):
    type: Literal["response.queued"] = "response.queued"
    response: ResponseResource


class ResponseInProgress(StreamEvent):
    type: Literal["response.in_progress"] = "response.in_progress"
    response: ResponseResource


class ResponseCompleted(StreamEvent):
    type: Literal["response.completed"] = "response.completed"
    response: ResponseResource


class ResponseFailed(StreamEvent):
    type: Literal["response.failed"] = "response.failed"
    response: ResponseResource


class ResponseIncomplete(StreamEvent):
    type: Literal["response.incomplete"] = "response.incomplete"
    response: ResponseResource


ResponseEvent = (ResponseCreated | ResponseQueued | ResponseInProgress | ResponseCompleted | ResponseFailed
                 | ResponseIncomplete)

RESPONSE_EVENTS: frozenset[type[StreamEvent]] = frozenset(
    {ResponseCreated, ResponseQueued, ResponseInProgress, ResponseCompleted, ResponseFailed, ResponseIncomplete}
)
"""The events that carry the response: their JSON is ``type``, ``sequence_number``, then
the response's own JSON."""


# ---------------------------------------------------------------- items and parts


class OutputItemAdded(StreamEvent):
    type: Literal["response.output_item.added"] = "response.output_item.added"
    output_index: int
    item: OutputItem


class OutputItemDone(StreamEvent):
    type: Literal["response.output_item.done"] = "response.output_item.done"
    output_index: int
    item: OutputItem


class ContentPartAdded(StreamEvent):
    type: Literal["response.content_part.added"] = "response.content_part.added"
    item_id: str
    output_index: int
    content_index: int
    part: StreamablePart


class ContentPartDone(StreamEvent):
    type: Literal["response.content_part.done"] = "response.content_part.done"
    item_id: str
    output_index: int
    content_index: int
    part: StreamablePart


# ---------------------------------------------------------------- text and refusal


class OutputTextDelta(StreamEvent):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[LogProb] | None = None
    obfuscation: str | None = None
    omit_if_none = frozenset({"logprobs", "obfuscation"})


class OutputTextDone(StreamEvent):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[LogProb] | None = None
    omit_if_none = frozenset({"logprobs"})


class OutputTextAnnotationAdded(StreamEvent):
    type: Literal["response.output_text.annotation.added"] = "response.output_text.annotation.added"
    item_id: str
    output_index: int
    content_index: int
    annotation_index: int
    annotation: UrlCitation


class RefusalDelta(StreamEvent):
    type: Literal["response.refusal.delta"] = "response.refusal.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str


class RefusalDone(StreamEvent):
    type: Literal["response.refusal.done"] = "response.refusal.done"
    item_id: str
    output_index: int
    content_index: int
    refusal: str


# ---------------------------------------------------------------- function calls


class FunctionCallArgumentsDelta(StreamEvent):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    item_id: str
    output_index: int
    delta: str
    obfuscation: str | None = None
    omit_if_none = frozenset({"obfuscation"})


class FunctionCallArgumentsDone(StreamEvent):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    arguments: str


# ---------------------------------------------------------------- reasoning


class ReasoningSummaryPartAdded(StreamEvent):
    type: Literal["response.reasoning_summary_part.added"] = "response.reasoning_summary_part.added"
    item_id: str
    output_index: int
    summary_index: int
    part: SummaryText


class ReasoningSummaryPartDone(StreamEvent):
    type: Literal["response.reasoning_summary_part.done"] = "response.reasoning_summary_part.done"
    item_id: str
    output_index: int
    summary_index: int
    part: SummaryText


class ReasoningSummaryTextDelta(StreamEvent):
    type: Literal["response.reasoning_summary_text.delta"] = "response.reasoning_summary_text.delta"
    item_id: str
    output_index: int
    summary_index: int
    delta: str
    obfuscation: str | None = None
    omit_if_none = frozenset({"obfuscation"})


class ReasoningSummaryTextDone(StreamEvent):
    type: Literal["response.reasoning_summary_text.done"] = "response.reasoning_summary_text.done"
    item_id: str
    output_index: int
    summary_index: int
    text: str


class ReasoningDelta(StreamEvent):
    type: Literal["response.reasoning.delta"] = "response.reasoning.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str
    obfuscation: str | None = None
    omit_if_none = frozenset({"obfuscation"})


class ReasoningDone(StreamEvent):
    type: Literal["response.reasoning.done"] = "response.reasoning.done"
    item_id: str
    output_index: int
    content_index: int
    text: str


# ---------------------------------------------------------------- errors


class ErrorPayload(WireModel):
    type: str
    code: str | None
    message: str
    param: str | None


class ErrorEvent(StreamEvent):
    type: Literal["error"] = "error"
    error: ErrorPayload


TERMINAL_EVENT_TYPES = frozenset({"response.completed", "response.failed", "response.incomplete"})

Event = Annotated[
    ResponseCreated
    | ResponseQueued
    | ResponseInProgress
    | ResponseCompleted
    | ResponseFailed
    | ResponseIncomplete
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | OutputTextAnnotationAdded
    | RefusalDelta
    | RefusalDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | ReasoningSummaryPartAdded
    | ReasoningSummaryPartDone
    | ReasoningSummaryTextDelta
    | ReasoningSummaryTextDone
    | ReasoningDelta
    | ReasoningDone
    | ErrorEvent,
    Field(discriminator="type"),
]


def serialize_event(event: StreamEvent) -> str:
    """The event's JSON, the one way an event becomes text: SSE and WebSocket frames, the
    stored events and a follower's events are all this text. It is what the event's model
    writes (its fields in order, those of ``omit_if_none`` left out when ``None``); the
    response an event carries is written by :func:`~app.protocol.responses.response_json`,
    once per snapshot however many events carry it."""
    if type(event) in RESPONSE_EVENTS:
        response = cast(ResponseEvent, event).response
        return (f'{{"type":"{event.type}","sequence_number":{event.sequence_number},'
                f'"response":{response_json(response)}}}')
    return event.model_dump_json()


def event_type_names() -> list[str]:
    """The ``type`` of every event class, in declaration order."""
    args: Any = Event.__origin__.__args__  # type: ignore[attr-defined]
    return [cls.model_fields["type"].default for cls in args]
