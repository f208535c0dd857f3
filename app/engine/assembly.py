"""Assembling a request: the checks and conversions :meth:`Engine.prepare
<app.engine.engine.Engine.prepare>` makes of a request before it can run.

What is here has no state of its own: the admission of a request's schemas (the replay
gate, ``text.format``), the input items kept (other vendors' extension items refused or
dropped, item references refused), the tool policy and output format a request asks for,
the :class:`GenerationRequest` made of it all, and access to sealed content (compaction
items, encrypted reasoning) for the context builder.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.backends.base import (
    Backend,
    ChatMessage,
    GenerationRequest,
    OutputFormat,
    Sampling,
    ToolPolicy,
    ToolSpec,
)
from app.engine.compaction import compaction_context
from app.engine.gate import UnknownToolPolicy, gate
from app.engine.history import History
from app.engine.mcp_loop import McpSetup
from app.engine.sealing import Sealer, SealError
from app.engine.tool_search import ToolSurface
from app.errors import InvalidRequest
from app.protocol.items import (
    CompactionParam,
    CompactionTriggerParam,
    ExtensionItemParam,
    ItemReferenceParam,
    UserMessageParam,
)
from app.protocol.responses import CreateResponseBody, TextFormatJsonObjectParam, TextFormatJsonSchemaParam
from app.protocol.tools import AllowedToolsParam, McpToolChoiceParam, McpToolParam, SpecificFunctionParam
from app.schemas import SchemaLimits, compile_schema

log = logging.getLogger("ors.engine")

OWN_EXTENSION_PREFIX = "ors:"


@dataclass(frozen=True, slots=True)
class Assembled:
    """A checked request and the model's context, not yet fitted to its window."""

    body: CreateResponseBody
    requested: str
    """The model id as asked for (an alias stays an alias)."""
    model: str
    backend: Backend
    past: History
    new_items: Sequence[object]
    sealed: Opener | None
    messages: list[ChatMessage]
    tools: tuple[ToolSpec, ...]
    trigger: int | None = None
    """Where the input's ``compaction_trigger`` is: a compaction turn
    (:mod:`app.engine.compaction_turn`); ``None`` for an ordinary turn."""
    surface: ToolSurface | None = None
    """The request's tools as its backend gets them (``tools`` the ones shown with the
    prompt), tool search included (:mod:`app.engine.tool_search`)."""
    conversation: str | None = None
    """The conversation the response continues (:mod:`app.engine.conversation_turns`)."""
    mcp: McpSetup | None = None
    """The request's MCP tools (:mod:`app.engine.mcp_loop`); ``None`` without one."""


class Opener:
    """Sealed content as the context builder needs it."""

    def __init__(self, sealer: Sealer) -> None:
        self.sealer = sealer

    def compaction_text(self, encrypted_content: str) -> str:
        return compaction_context(self.sealer, encrypted_content)

    def reasoning_text(self, encrypted_content: str) -> str | None:
        try:
            text = self.sealer.unseal("reasoning", encrypted_content).get("text")
        except SealError:
            return None
        return text if isinstance(text, str) else None


def check_compaction(sealed: Opener | None, item: CompactionParam, param: str) -> None:
    if sealed is None:
        raise InvalidRequest("This server cannot open compaction items.", code="unsupported_item", param=param)
    try:
        sealed.compaction_text(item.encrypted_content)
    except SealError as error:
        error.param = param
        raise


def reasoning_sealer(sealer: Sealer | None) -> Callable[[str], str]:
    assert sealer is not None
    return lambda text: sealer.seal("reasoning", {"text": text})


def input_items(body: CreateResponseBody, *, drop_foreign: bool) -> Sequence[object]:
    raw = body.input
    if raw is None:
        return []
    if isinstance(raw, str):
        return [UserMessageParam(role="user", content=raw)]
    kept: list[object] = []
    for index, item in enumerate(raw):
        param = f"input[{index}]"
        if isinstance(item, CompactionTriggerParam):  # a request control, never part of the conversation
            continue
        if isinstance(item, ExtensionItemParam):
            if item.type.startswith(OWN_EXTENSION_PREFIX):
                raise InvalidRequest(
                    f"Unknown item type '{item.type}': this server defines no such extension item.",
                    code="invalid_type",
                    param=f"{param}.type",
                )
            if drop_foreign:
                log.warning("dropped %s of type %r: another implementation's extension item", param, item.type)
                continue
            raise InvalidRequest(
                f"Item type '{item.type}' is another implementation's extension; it is not portable "
                "and this server cannot interpret it. Remove it from the input.",
                code="namespaced",
                param=param,
            )
        if isinstance(item, ItemReferenceParam):
            raise InvalidRequest(
                f"Item '{item.id}' cannot be referenced: item references are not supported; "
                "send the item itself or continue with previous_response_id.",
                code="unsupported_item",
                param=param,
            )
        kept.append(item)
    return kept


def tool_policy(body: CreateResponseBody, names: set[str] | None = None) -> ToolPolicy:
    """The policy ``body`` asks for over ``names`` (default: its functions), the
    functions it may name."""
    if names is None:
        names = {tool.name for tool in body.function_tools}
    choice = body.tool_choice
    parallel = True if body.parallel_tool_calls is None else body.parallel_tool_calls
    if isinstance(choice, SpecificFunctionParam):
        _require_tools(names, [choice.name], "tool_choice.name")
        return ToolPolicy(mode="required", allowed=(choice.name,), parallel=parallel, max_calls=body.max_tool_calls)
    if isinstance(choice, AllowedToolsParam):
        allowed = tuple(tool.name for tool in choice.tools)
        _require_tools(names, allowed, "tool_choice.tools")
        return ToolPolicy(mode=choice.mode, allowed=allowed, parallel=parallel, max_calls=body.max_tool_calls)
    if isinstance(choice, McpToolChoiceParam):  # its functions are known once listed (app.engine.mcp_loop)
        return ToolPolicy(mode="required", parallel=parallel, max_calls=body.max_tool_calls)
    mode = choice or "auto"
    if mode == "required" and not names and not any(isinstance(tool, McpToolParam) for tool in body.tools or ()):
        given = [f"'{tool.type}'" for tool in body.tools or ()]
        reason = (f"none of the tools given ({', '.join(given)}) can be offered to the model: this server runs "
                  "function tools, namespace tools, custom tools and MCP tools") if given else "no tools were given"
        raise InvalidRequest(f"tool_choice is 'required' but {reason}.", code="invalid_value", param="tool_choice")
    if mode == "auto" and parallel and body.max_tool_calls is None:
        return _AUTO
    return ToolPolicy(mode=mode, parallel=parallel, max_calls=body.max_tool_calls)


def _require_tools(names: set[str], wanted: Sequence[str], param: str) -> None:
    for name in wanted:
        if name not in names:
            raise InvalidRequest(
                f"tool_choice names the function '{name}', which is not in 'tools'.",
                code="invalid_value",
                param=param,
            )


def admit(
    data: dict[str, Any],
    *,
    history: Sequence[Any],
    tools: list[Any],
    history_tools: Sequence[Any],
    unknown_tool: UnknownToolPolicy,
    limits: SchemaLimits,
) -> None:
    """The replay gate (which compiles the tools' schemas), then ``text.format.schema``:
    every schema of the request goes through :mod:`app.schemas` before anything uses it."""
    gate(data.get("input"), history=history, tools=tools, history_tools=history_tools,
         unknown_tool=unknown_tool, schema_limits=limits)
    text = data.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and "schema" in fmt:
        problem = compile_schema(fmt["schema"], limits).problem
        if problem is not None:
            raise InvalidRequest(
                f"text.format.schema cannot be used as a JSON Schema (Draft 2020-12): {problem}.",
                code="invalid_json_schema",
                param="text.format.schema",
            )


_INLINE_ITEMS = 64
"""Above this many input items, even a gate without schemas walks them in a worker thread."""


def has_schema_work(data: dict[str, Any], past: History) -> bool:
    """Whether admitting the request compiles or validates against a schema (tools, a
    ``json_schema`` text format, or outputs answering calls of the chain's tools)."""
    if data.get("tools") or past.tools:
        return True
    items = data.get("input")
    if isinstance(items, list) and len(items) > _INLINE_ITEMS:
        return True
    text = data.get("text")
    return isinstance(text, dict) and isinstance(text.get("format"), dict)


def output_format(body: CreateResponseBody) -> OutputFormat:
    fmt = body.text.format if body.text else None
    if isinstance(fmt, TextFormatJsonSchemaParam):
        return OutputFormat(kind="json_schema", name=fmt.name, schema=fmt.schema_, strict=fmt.strict)
    if isinstance(fmt, TextFormatJsonObjectParam):
        return _JSON_OBJECT
    return _FREE_TEXT


_FREE_TEXT, _JSON_OBJECT = OutputFormat(), OutputFormat(kind="json_object")
_AUTO = ToolPolicy()
"""What most requests ask for, made once (frozen, so shared by every request that does)."""


def generation_request(body: CreateResponseBody, model: str, messages: Sequence[ChatMessage],
                       tools: tuple[ToolSpec, ...], surface: ToolSurface | None = None) -> GenerationRequest:
    """What the backend is asked for: the context fitted to the model's window, the tools
    and the policy over them, sampling, the output format. Incremental: a run that
    nobody reads before its end asks for it whole (:meth:`Prepared.whole_request`).
    With tool search (``surface``), the policy may name any function of the request,
    deferred ones included, and the search function."""
    names = None
    if surface is not None and (surface.searches or surface.late_tools):
        names = {*surface.offered, *(tool.name for tool in (*tools, *surface.late_tools))}
    return GenerationRequest(
        model=model,
        messages=tuple(messages),
        tools=tools,
        late_tools=surface.late_tools if surface is not None else (),
        tool_search=surface.hosted if surface is not None else None,
        tool_policy=tool_policy(body, names),
        sampling=Sampling(
            temperature=body.temperature,
            top_p=body.top_p,
            max_output_tokens=body.max_output_tokens,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            top_logprobs=body.top_logprobs,
            logprobs="message.output_text.logprobs" in (body.include or []) or bool(body.top_logprobs),
        ),
        output_format=output_format(body),
        reasoning_effort=body.reasoning.effort if body.reasoning else None,
        cache_key=body.prompt_cache_key,
    )
