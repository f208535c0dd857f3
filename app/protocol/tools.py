"""Tool definitions and ``tool_choice``, as sent and as echoed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from app.protocol.base import ParamModel, WireModel
from app.protocol.items import FunctionName

ToolChoiceMode = Literal["none", "auto", "required"]

# ---------------------------------------------------------------- params (input)


class FunctionToolParam(ParamModel):
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None
    """OpenAI superset field: the function is hidden from the model until a tool search
    loads it (a request with a deferred tool needs a ``tool_search`` tool)."""


class NamespaceToolParam(ParamModel):
    """A group of function tools under one name (OpenAI's ``namespace`` tool, which Codex
    sends for its sub-agent tools). Not in the spec: each function is offered to the
    model under its flat name (:func:`qualified_name`), and a call of it comes back as a
    ``function_call`` whose ``name`` is the function's own and whose ``namespace`` is
    this tool's ``name``, the shape OpenAI answers with and Codex reads."""

    type: Literal["namespace"]
    name: FunctionName
    description: str | None = None
    tools: list[FunctionToolParam] = Field(min_length=1)
    defer_loading: bool | None = None
    """Every function of the namespace is deferred (a function may also be deferred alone)."""


class CustomTextFormatParam(ParamModel):
    type: Literal["text"]


class CustomGrammarFormatParam(ParamModel):
    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str = Field(max_length=262_144)


class CustomToolParam(ParamModel):
    """OpenAI's free-form tool: the model's call carries one text, ``input``, instead of
    JSON arguments. Not in the spec. Offered to the model as a function of one string
    parameter ``input``; its calls come back as OpenAI's ``custom_tool_call`` items.

    ``format`` says what the text must be: ``text`` (anything, the default), or a
    ``grammar``. A ``regex`` one becomes the parameter's ``pattern``: the embedded engine
    constrains a forced call with it, and every call's input is checked against it with
    RE2 (one that does not match is suppressed). A ``lark`` one (Codex's free-form
    ``apply_patch``) is made into the embedded engine's grammar for a forced call
    (:mod:`app.backends.lark_gbnf`); calls made freely are not checked against it."""

    type: Literal["custom"]
    name: FunctionName
    description: str | None = None
    format: Annotated[CustomTextFormatParam | CustomGrammarFormatParam, Field(discriminator="type")] | None = None
    defer_loading: bool | None = None

    @property
    def regex(self) -> str | None:
        fmt = self.format
        return fmt.definition if isinstance(fmt, CustomGrammarFormatParam) and fmt.syntax == "regex" else None

    @property
    def lark(self) -> str | None:
        fmt = self.format
        return fmt.definition if isinstance(fmt, CustomGrammarFormatParam) and fmt.syntax == "lark" else None


class ToolSearchToolParam(ParamModel):
    """OpenAI's ``tool_search`` tool: the model may search the request's deferred tools
    (``defer_loading``) and load those it needs. ``execution`` ``server`` (the default)
    has the server run the search (this server does, for any model); ``client`` makes
    each search a ``tool_search_call`` the client answers with a ``tool_search_output``
    carrying the tools to load. ``description`` and ``parameters`` describe a client's
    search to the model. Not in the spec."""

    type: Literal["tool_search"]
    execution: Literal["server", "client"] | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class McpToolNamesParam(ParamModel):
    tool_names: list[str] | None = None
    read_only: bool | None = None


class McpApprovalFilterParam(ParamModel):
    always: McpToolNamesParam | None = None
    never: McpToolNamesParam | None = None


class McpToolParam(ParamModel):
    """OpenAI's remote MCP tool: this server connects to ``server_url`` (an MCP server,
    streamable HTTP, or SSE when the path ends in ``/sse``), lists its tools, offers them
    to the model and runs the model's calls of them itself (:mod:`app.engine.mcp`). Only
    URLs of ``ORS_MCP_ALLOWED_URLS`` are reached. ``headers`` and ``authorization`` go to
    that server alone and are never echoed, stored nor logged. ``require_approval``
    defaults to ``always``, as in OpenAI's API. Not in the spec."""

    type: Literal["mcp"]
    server_label: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    server_url: str = Field(min_length=1, max_length=2_000)
    server_description: str | None = None
    allowed_tools: list[str] | McpToolNamesParam | None = None
    require_approval: Literal["always", "never"] | McpApprovalFilterParam | None = None
    headers: dict[str, str] | None = None
    authorization: str | None = None

    def allows(self, name: str) -> bool:
        """Whether ``allowed_tools`` lets the model see the server's tool ``name``."""
        allowed = self.allowed_tools
        names = allowed.tool_names if isinstance(allowed, McpToolNamesParam) else allowed
        return names is None or name in names

    def needs_approval(self, name: str) -> bool:
        """Whether a call of ``name`` waits for the client's ``mcp_approval_response``."""
        rule = self.require_approval
        if rule is None or rule == "always":
            return True
        if rule == "never":
            return False
        never = rule.never.tool_names if rule.never is not None else None
        always = rule.always.tool_names if rule.always is not None else None
        if always is not None and name in always:
            return True
        return never is None or name not in never


class UnsupportedToolParam(ParamModel):
    """A tool of a type this server cannot run (hosted tools, vendor tools). Accepted so
    such clients work; the engine leaves it out of what the model sees and logs that it
    did."""

    model_config = ParamModel.model_config | {"extra": "allow"}
    type: str


def _tool_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind in ("namespace", "custom", "tool_search", "mcp"):
        return kind
    return "function" if kind == "function" or not isinstance(kind, str) else "unsupported"


ToolParam = Annotated[
    Annotated[FunctionToolParam, Tag("function")]
    | Annotated[NamespaceToolParam, Tag("namespace")]
    | Annotated[CustomToolParam, Tag("custom")]
    | Annotated[ToolSearchToolParam, Tag("tool_search")]
    | Annotated[McpToolParam, Tag("mcp")]
    | Annotated[UnsupportedToolParam, Tag("unsupported")],
    Discriminator(_tool_tag),
]

NAMESPACE_DELIMITER = "__"


def qualified_name(namespace: str | None, name: str) -> str:
    """The flat name a function of ``namespace`` is offered to a model under:
    ``namespace__name``, with stray underscores at the join trimmed (the convention
    Codex itself flattens namespaced tools by). A plain function keeps its name."""
    if namespace is None:
        return name
    return f"{namespace.rstrip('_')}{NAMESPACE_DELIMITER}{name.lstrip('_')}"


CUSTOM_INPUT = "input"
"""The one parameter a custom tool is offered to a model with: the call's whole text."""


def custom_parameters(regex: str | None) -> dict[str, Any]:
    """The JSON Schema of a custom tool's one parameter as a model sees it; a ``regex``
    format becomes the parameter's ``pattern``, anchored: the whole text must match."""
    text: dict[str, Any] = {"type": "string", "description": "The tool's whole input, as free-form text."}
    if regex is not None:
        text["pattern"] = f"^({regex})$"
    return {"type": "object", "properties": {CUSTOM_INPUT: text}, "required": [CUSTOM_INPUT],
            "additionalProperties": False}


@dataclass(frozen=True, slots=True)
class OfferedFunction:
    """A function the model may call: a function tool, one function of a namespace
    tool, or a custom tool (as a function of one string, ``input``). ``name`` is what
    the model sees and calls; ``function`` and ``namespace`` are what a
    ``function_call`` item carries, ``function`` what a ``custom_tool_call`` does."""

    tool: FunctionToolParam | CustomToolParam
    namespace: NamespaceToolParam | None = None

    @property
    def name(self) -> str:
        return qualified_name(self.namespace.name if self.namespace else None, self.tool.name)

    @property
    def function(self) -> str:
        return self.tool.name

    @property
    def namespace_name(self) -> str | None:
        return self.namespace.name if self.namespace else None

    @property
    def custom(self) -> bool:
        return isinstance(self.tool, CustomToolParam)

    @property
    def deferred(self) -> bool:
        """Hidden from the model until a tool search loads it (``defer_loading`` on the
        function or on its namespace)."""
        return bool(self.tool.defer_loading or (self.namespace is not None and self.namespace.defer_loading))

    @property
    def parameters(self) -> dict[str, Any] | None:
        if isinstance(self.tool, CustomToolParam):
            return custom_parameters(self.tool.regex)
        return self.tool.parameters

    @property
    def lark(self) -> str | None:
        """A custom tool's Lark grammar, which its input must follow."""
        return self.tool.lark if isinstance(self.tool, CustomToolParam) else None

    @property
    def strict(self) -> bool | None:
        return True if isinstance(self.tool, CustomToolParam) else self.tool.strict

    @property
    def description(self) -> str | None:
        """The function's description, after its namespace's when it has one: a model
        sees no namespaces, only what the group is for."""
        group = self.namespace.description if self.namespace else None
        if not group:
            return self.tool.description
        return f"{group}\n\n{self.tool.description}" if self.tool.description else group


def offered_functions(tools: Sequence[Any] | None) -> list[OfferedFunction]:
    """Every function of ``tools`` the model is offered, in order, namespaces flattened."""
    offered: list[OfferedFunction] = []
    for tool in tools or ():
        if isinstance(tool, FunctionToolParam):
            offered.append(OfferedFunction(tool))
        elif isinstance(tool, NamespaceToolParam):
            offered.extend(OfferedFunction(inner, tool) for inner in tool.tools)
        elif isinstance(tool, CustomToolParam):
            offered.append(OfferedFunction(tool))
    return offered


class SpecificFunctionParam(ParamModel):
    """A named tool to call: ``function`` (the spec), or ``custom`` (OpenAI's choice of
    a custom tool, which this server treats the same way)."""

    type: Literal["function", "custom"]
    name: str


class AllowedToolsParam(ParamModel):
    type: Literal["allowed_tools"]
    tools: list[SpecificFunctionParam] = Field(min_length=1, max_length=128)
    mode: ToolChoiceMode = "auto"


class McpToolChoiceParam(ParamModel):
    """OpenAI's choice of an MCP server's tools (``name``: one of them): the model must
    call one (echoed as ``required``: the spec's ``tool_choice`` has no such form). Not in
    the spec."""

    type: Literal["mcp"]
    server_label: str
    name: str | None = None


ToolChoiceParam = (
    ToolChoiceMode
    | Annotated[SpecificFunctionParam | AllowedToolsParam | McpToolChoiceParam, Field(discriminator="type")]
)

# ---------------------------------------------------------------- fields (output)


class FunctionTool(WireModel):
    """A function tool as echoed. ``namespace`` (not in the spec, omitted when ``None``)
    names the namespace tool it came from; ``name`` is then the function's own."""

    omit_if_none = frozenset({"namespace"})
    type: Literal["function"] = "function"
    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None
    namespace: str | None = None


class FunctionToolChoice(WireModel):
    type: Literal["function"] = "function"
    name: str


class AllowedToolChoice(WireModel):
    type: Literal["allowed_tools"] = "allowed_tools"
    tools: list[FunctionToolChoice]
    mode: ToolChoiceMode


ToolChoice = ToolChoiceMode | FunctionToolChoice | AllowedToolChoice
