"""The initial ``ResponseResource``: every request field echoed, spec defaults filled in."""

from __future__ import annotations

import time

from app.protocol.responses import (
    CreateResponseBody,
    ReasoningConfig,
    ResponseResource,
    TextField,
    TextFormatJsonObject,
    TextFormatJsonObjectParam,
    TextFormatJsonSchema,
    TextFormatJsonSchemaParam,
    TextFormatText,
)
from app.protocol.states import ResponseStatus
from app.protocol.tools import (
    AllowedToolChoice,
    AllowedToolsParam,
    FunctionTool,
    FunctionToolChoice,
    McpToolChoiceParam,
    SpecificFunctionParam,
    ToolChoice,
)

DEFAULT_SERVICE_TIER = "default"


def echo_tool_choice(body: CreateResponseBody) -> ToolChoice:
    choice = body.tool_choice
    if choice is None:
        return "auto"
    if isinstance(choice, SpecificFunctionParam):
        return FunctionToolChoice(name=choice.name)
    if isinstance(choice, McpToolChoiceParam):
        return "required"  # the spec's echo has no MCP choice; its meaning is this
    if isinstance(choice, AllowedToolsParam):
        return AllowedToolChoice(
            tools=[FunctionToolChoice(name=tool.name) for tool in choice.tools], mode=choice.mode
        )
    return choice


_PLAIN_TEXT = TextField(format=TextFormatText(), verbosity=None)
_NO_REASONING = ReasoningConfig(effort=None, summary=None)
"""The echoes of a request that sets no ``text`` or no ``reasoning`` (most requests): one
each for every response, as wire objects are never changed once made."""


def echo_text(body: CreateResponseBody) -> TextField:
    text = body.text
    if text is None:
        return _PLAIN_TEXT
    fmt = text.format if text is not None else None
    wire_format: TextFormatText | TextFormatJsonObject | TextFormatJsonSchema
    if isinstance(fmt, TextFormatJsonSchemaParam):
        wire_format = TextFormatJsonSchema(
            name=fmt.name, description=fmt.description, schema=fmt.schema_, strict=bool(fmt.strict)
        )
    elif isinstance(fmt, TextFormatJsonObjectParam):
        wire_format = TextFormatJsonObject()
    else:
        wire_format = TextFormatText()
    return TextField(format=wire_format, verbosity=text.verbosity if text is not None else None)


def echo_reasoning(body: CreateResponseBody) -> ReasoningConfig:
    reasoning = body.reasoning
    if reasoning is None:
        return _NO_REASONING
    return ReasoningConfig(effort=reasoning.effort, summary=reasoning.summary or reasoning.generate_summary)


def initial_response(
    body: CreateResponseBody,
    *,
    response_id: str,
    model: str,
    status: ResponseStatus = ResponseStatus.IN_PROGRESS,
    created_at: int | None = None,
) -> ResponseResource:
    """The snapshot sent with ``response.created``: status ``in_progress`` (or
    ``queued``), empty output, no usage, every echo field present."""
    return ResponseResource(
        id=response_id,
        created_at=created_at if created_at is not None else int(time.time()),
        completed_at=None,
        status=status,
        incomplete_details=None,
        model=model,
        previous_response_id=body.previous_response_id,
        instructions=body.instructions,
        output=[],
        error=None,
        tools=[
            FunctionTool(
                name=offered.function,
                description=offered.tool.description,
                parameters=offered.parameters,
                strict=offered.strict,
                namespace=offered.namespace_name,
            )
            for offered in body.function_tools
            if not offered.custom  # the spec's ``tools`` holds function tools only
        ],
        tool_choice=echo_tool_choice(body),
        truncation=body.truncation or "disabled",
        parallel_tool_calls=True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        text=echo_text(body),
        top_p=1.0 if body.top_p is None else body.top_p,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        top_logprobs=body.top_logprobs or 0,
        temperature=1.0 if body.temperature is None else body.temperature,
        reasoning=echo_reasoning(body),
        usage=None,
        max_output_tokens=body.max_output_tokens,
        max_tool_calls=body.max_tool_calls,
        store=True if body.store is None else body.store,
        background=bool(body.background),
        service_tier=DEFAULT_SERVICE_TIER,
        metadata=dict(body.metadata or {}),
        safety_identifier=body.safety_identifier,
        prompt_cache_key=body.prompt_cache_key,
    )
