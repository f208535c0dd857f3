"""The request body of ``POST /v1/responses`` and the ``ResponseResource`` it produces."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.protocol.base import ParamModel, WireModel
from app.protocol.items import ItemId, ItemParam, OutputItem
from app.protocol.tools import FunctionTool, OfferedFunction, ToolChoice, ToolChoiceParam, ToolParam, offered_functions

IncludeOption = Literal["reasoning.encrypted_content", "message.output_text.logprobs"]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
ReasoningSummary = Literal["concise", "detailed", "auto"]
Truncation = Literal["auto", "disabled"]
ServiceTier = Literal["auto", "default", "flex", "priority"]
Verbosity = Literal["low", "medium", "high"]
# Named in code by app.protocol.states.ResponseStatus, whose values a test holds equal.
ResponseStatus = Literal["queued", "in_progress", "completed", "failed", "incomplete", "cancelled"]

# ---------------------------------------------------------------- params (input)


class TextFormatTextParam(ParamModel):
    type: Literal["text"]


class TextFormatJsonObjectParam(ParamModel):
    type: Literal["json_object"]


class TextFormatJsonSchemaParam(ParamModel):
    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None

    model_config = ParamModel.model_config | {"populate_by_name": True}


TextFormatParam = Annotated[
    TextFormatTextParam | TextFormatJsonObjectParam | TextFormatJsonSchemaParam,
    Field(discriminator="type"),
]


class TextParam(ParamModel):
    format: TextFormatParam | None = None
    verbosity: Verbosity | None = None


class ReasoningConfigParam(ParamModel):
    effort: ReasoningEffort | None = None
    summary: ReasoningSummary | None = None
    generate_summary: ReasoningSummary | None = None
    """Deprecated OpenAI alias of ``summary``; accepted."""


class StreamOptionsParam(ParamModel):
    include_obfuscation: bool | None = None


class CreateResponseBody(BaseModel):
    """``CreateResponseBody``. Unknown top-level fields are ignored (and logged by the
    transport); everything inside items is strict."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[ItemParam] | None = Field(default=None)
    instructions: str | None = None
    previous_response_id: ItemId | None = None
    conversation: str | dict[str, str] | None = None
    """OpenAI's superset: the conversation the response continues and is added to
    (checked by :mod:`app.engine.conversation_turns`)."""
    include: list[IncludeOption] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=16)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    text: TextParam | None = None
    reasoning: ReasoningConfigParam | None = None
    stream: bool | None = None
    stream_options: StreamOptionsParam | None = None
    background: bool | None = None
    store: bool | None = None
    truncation: Truncation | None = None
    service_tier: ServiceTier | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = None
    safety_identifier: str | None = Field(default=None, max_length=64)
    prompt_cache_key: str | None = Field(default=None, max_length=64)
    user: str | None = None
    """OpenAI superset field; accepted and ignored."""

    @property
    def function_tools(self) -> list[OfferedFunction]:
        """The functions offered to the model: function tools, and the functions of
        namespace tools under their flat names; tools of other types are not offered."""
        return offered_functions(self.tools)

    @field_validator("input", mode="before")
    @classmethod
    def _input_length(cls, value: Any) -> Any:
        if isinstance(value, str) and len(value) > 10_485_760:
            raise ValueError("String should have at most 10485760 characters")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return metadata_limits(value)


def metadata_limits(value: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's limits of ``metadata``: at most 16 pairs, keys of at most 64 characters
    (values of at most 512 are the field's own type)."""
    if value is not None:
        if len(value) > 16:
            raise ValueError("metadata may hold at most 16 key-value pairs")
        for key in value:
            if len(key) > 64:
                raise ValueError(f"metadata key {key[:20]!r}... is longer than 64 characters")
    return value


# ---------------------------------------------------------------- fields (output)


class InputTokensDetails(WireModel):
    cached_tokens: int = 0


class OutputTokensDetails(WireModel):
    reasoning_tokens: int = 0


class Usage(WireModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)


class TextFormatText(WireModel):
    type: Literal["text"] = "text"


class TextFormatJsonObject(WireModel):
    type: Literal["json_object"] = "json_object"


class TextFormatJsonSchema(WireModel):
    type: Literal["json_schema"] = "json_schema"
    name: str
    description: str | None
    schema_: dict[str, Any] | None = Field(alias="schema", serialization_alias="schema")
    strict: bool

    model_config = WireModel.model_config | {"populate_by_name": True, "serialize_by_alias": True}


class TextField(WireModel):
    format: TextFormatText | TextFormatJsonObject | TextFormatJsonSchema
    verbosity: Verbosity | None = None
    omit_if_none = frozenset({"verbosity"})


class ReasoningConfig(WireModel):
    effort: ReasoningEffort | None
    summary: ReasoningSummary | None


class IncompleteDetails(WireModel):
    reason: str


class ResponseError(WireModel):
    code: str
    message: str


class ResponseResource(WireModel):
    """The ``response`` object: all 31 fields are always present."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None
    status: ResponseStatus
    incomplete_details: IncompleteDetails | None
    model: str
    previous_response_id: str | None
    instructions: str | None
    output: list[OutputItem]
    error: ResponseError | None
    tools: list[FunctionTool]
    tool_choice: ToolChoice
    truncation: Truncation
    parallel_tool_calls: bool
    text: TextField
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    top_logprobs: int
    temperature: float
    reasoning: ReasoningConfig | None
    usage: Usage | None
    max_output_tokens: int | None
    max_tool_calls: int | None
    store: bool
    background: bool
    service_tier: str
    metadata: dict[str, str]
    safety_identifier: str | None
    prompt_cache_key: str | None


def response_json(resource: ResponseResource) -> str:
    """``resource`` as JSON (what its model writes), made once per snapshot in a row.

    A snapshot is never changed once made (a change makes a new one, ``model_copy``), and
    the events and records that carry one come one after the other: ``response.created``
    and ``response.in_progress`` carry the same snapshot, as the terminal event, the
    stored end and a JSON answer do. The last snapshot serialized and its JSON are kept
    (the snapshot itself, so its identity cannot be reused); another snapshot replaces
    them."""
    last = _last_response_json[0]
    if last[0] is resource:
        return last[1]
    text = resource.model_dump_json()
    _last_response_json[0] = (resource, text)  # one assignment: a reader sees a pair whole
    return text


_last_response_json: list[tuple[ResponseResource | None, str]] = [(None, "")]


class DeletedResponse(WireModel):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True
