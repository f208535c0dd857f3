"""Items: the units of a conversation, as clients send them and as the server emits them.

Input (``ItemParam``) is a union discriminated by ``type`` and, for messages, by ``role``.
Leniency the spec and its acceptance suite rely on: a message without ``type``, a string
``content``, and a bare ``{"id": ...}`` item reference. Extension types carry a slug
prefix (``ors:...``); anything else unknown is rejected with a precise ``param``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from app.protocol.base import ParamModel, WireModel
from app.protocol.content import (
    AssistantContentParam,
    ContentPart,
    ReasoningText,
    SummaryText,
    SummaryTextParam,
    SystemContentParam,
    ToolOutputContentParam,
    ToolOutputPart,
    UserContentParam,
)
from app.protocol.mcp import (
    McpApprovalRequest,
    McpApprovalRequestParam,
    McpApprovalResponseParam,
    McpCall,
    McpCallParam,
    McpListTools,
    McpListToolsParam,
)

# The wire types stay Literal (what pydantic validates and serializes as plain strings);
# code names the states by app.protocol.states.ItemStatus, whose values a test holds equal.
ItemStatus = Literal["in_progress", "completed", "incomplete"]
ToolSearchExecution = Literal["server", "client"]
Phase = Literal["commentary", "final_answer"]
MessageRole = Literal["user", "assistant", "system", "developer"]

CallId = Annotated[str, Field(min_length=1, max_length=64)]
MAX_ID_LENGTH = 512
"""The longest id a request may name (a response, an item, a conversation, a cursor)."""
ItemId = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]
"""An item's id as a client sends it: absent, or a non-empty string (``""`` is not
"absent", which would have a new id made, but a 400 on the field)."""
FunctionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]

# ---------------------------------------------------------------- params (input)


class UserMessageParam(ParamModel):
    type: Literal["message"] = "message"
    role: Literal["user"]
    content: str | list[UserContentParam]
    id: ItemId | None = None
    status: str | None = None


class SystemMessageParam(ParamModel):
    type: Literal["message"] = "message"
    role: Literal["system"]
    content: str | list[SystemContentParam]
    id: ItemId | None = None
    status: str | None = None


class DeveloperMessageParam(ParamModel):
    type: Literal["message"] = "message"
    role: Literal["developer"]
    content: str | list[SystemContentParam]
    id: ItemId | None = None
    status: str | None = None


class AssistantMessageParam(ParamModel):
    type: Literal["message"] = "message"
    role: Literal["assistant"]
    content: str | list[AssistantContentParam]
    id: ItemId | None = None
    status: str | None = None
    phase: Phase | None = None


class FunctionCallParam(ParamModel):
    type: Literal["function_call"]
    call_id: CallId
    name: FunctionName
    arguments: str
    id: ItemId | None = None
    status: ItemStatus | None = None
    namespace: FunctionName | None = None
    """Not in the spec: the namespace tool ``name`` belongs to (see ``FunctionCall``)."""


class FunctionCallOutputParam(ParamModel):
    type: Literal["function_call_output"]
    call_id: CallId
    output: str | list[ToolOutputContentParam]
    id: ItemId | None = None
    status: ItemStatus | None = None


class CustomToolCallParam(ParamModel):
    """OpenAI's call of a ``custom`` (free-form) tool, replayed. Not in the spec."""

    type: Literal["custom_tool_call"]
    call_id: CallId
    name: FunctionName
    input: str
    id: ItemId | None = None
    status: ItemStatus | None = None


class CustomToolCallOutputParam(ParamModel):
    """The answer to a ``custom_tool_call``. Not in the spec."""

    type: Literal["custom_tool_call_output"]
    call_id: CallId
    output: str | list[ToolOutputContentParam]
    id: ItemId | None = None
    status: ItemStatus | None = None


class ReasoningParam(ParamModel):
    type: Literal["reasoning"]
    summary: list[SummaryTextParam]
    id: ItemId | None = None
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


class CompactionParam(ParamModel):
    type: Literal["compaction"]
    encrypted_content: str = Field(max_length=10_485_760)
    id: ItemId | None = None
    created_by: str | None = None
    status: ItemStatus | None = None


class CompactionTriggerParam(ParamModel):
    """OpenAI's request for a compaction turn (Codex's remote compaction): the last input
    item, bare (``{"type": "compaction_trigger"}``, no other field, not even ``id``). The
    response then holds exactly one ``compaction`` item. A request control, never stored
    nor echoed. Not in the spec."""

    type: Literal["compaction_trigger"]


class ToolSearchCallParam(ParamModel):
    """OpenAI's ``tool_search_call`` replayed: a search of the deferred tools, run by the
    server (``execution: server``, answered in the same response) or handed to the
    client (``client``). Not in the spec."""

    type: Literal["tool_search_call"]
    arguments: dict[str, Any]
    call_id: CallId | None = None
    execution: ToolSearchExecution | None = None
    id: ItemId | None = None
    status: ItemStatus | None = None
    created_by: str | None = None


class ToolSearchOutputParam(ParamModel):
    """The tools a tool search loaded: each is callable from here on in the conversation,
    shown to the model where this item stands. ``tools`` hold tool definitions as
    ``tools`` does (function, namespace and custom tools; the engine checks each one).
    A client-executed search's output names its call's ``call_id``. Not in the spec."""

    type: Literal["tool_search_output"]
    tools: list[dict[str, Any]]
    call_id: CallId | None = None
    execution: ToolSearchExecution | None = None
    id: ItemId | None = None
    status: ItemStatus | None = None
    created_by: str | None = None


class ItemReferenceParam(ParamModel):
    type: Literal["item_reference"] | None = None
    id: str


class ExtensionItemParam(ParamModel):
    """An item whose ``type`` carries a vendor slug (``acme:thing``). Kept opaque here;
    the engine decides whether it is ours (``ors:``) or foreign."""

    model_config = ParamModel.model_config | {"extra": "allow"}
    type: str


_MESSAGE_TAGS = {
    "user": "user_message",
    "system": "system_message",
    "developer": "developer_message",
    "assistant": "assistant_message",
}
_ITEM_TAGS = {
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
    "compaction",
    "compaction_trigger",
    "item_reference",
    "tool_search_call",
    "tool_search_output",
    "mcp_list_tools",
    "mcp_call",
    "mcp_approval_request",
    "mcp_approval_response",
}


def _item_tag(value: Any) -> str | None:
    """Pick the input-item variant; ``None`` makes pydantic report an unknown type. A
    ``type`` or ``role`` of any JSON value is read here, lists and objects included
    (never looked up as a key: they cannot be one)."""
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind is None:
        if "role" in value:
            kind = "message"
        elif "id" in value:
            return "item_reference"
        else:
            return None
    if not isinstance(kind, str):
        return None
    if kind == "message":
        role = value.get("role")
        return _MESSAGE_TAGS.get(role, "invalid_role") if isinstance(role, str) else "invalid_role"
    if kind in _ITEM_TAGS:
        return kind
    if ":" in kind:
        return "extension"
    return None


class _InvalidRoleMessage(ParamModel):
    """Never valid: a message with a role outside user/system/developer/assistant."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]


ItemParam = Annotated[
    Annotated[UserMessageParam, Tag("user_message")]
    | Annotated[SystemMessageParam, Tag("system_message")]
    | Annotated[DeveloperMessageParam, Tag("developer_message")]
    | Annotated[AssistantMessageParam, Tag("assistant_message")]
    | Annotated[_InvalidRoleMessage, Tag("invalid_role")]
    | Annotated[FunctionCallParam, Tag("function_call")]
    | Annotated[FunctionCallOutputParam, Tag("function_call_output")]
    | Annotated[CustomToolCallParam, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputParam, Tag("custom_tool_call_output")]
    | Annotated[ReasoningParam, Tag("reasoning")]
    | Annotated[CompactionParam, Tag("compaction")]
    | Annotated[CompactionTriggerParam, Tag("compaction_trigger")]
    | Annotated[ItemReferenceParam, Tag("item_reference")]
    | Annotated[ToolSearchCallParam, Tag("tool_search_call")]
    | Annotated[ToolSearchOutputParam, Tag("tool_search_output")]
    | Annotated[McpListToolsParam, Tag("mcp_list_tools")]
    | Annotated[McpCallParam, Tag("mcp_call")]
    | Annotated[McpApprovalRequestParam, Tag("mcp_approval_request")]
    | Annotated[McpApprovalResponseParam, Tag("mcp_approval_response")]
    | Annotated[ExtensionItemParam, Tag("extension")],
    Discriminator(
        _item_tag,
        custom_error_type="unknown_item_type",
        custom_error_message="Unknown input item type: expected message, function_call, "
        "function_call_output, reasoning, compaction, compaction_trigger or item_reference",
    ),
]

MessageParam = UserMessageParam | SystemMessageParam | DeveloperMessageParam | AssistantMessageParam

# ---------------------------------------------------------------- fields (output)


class Message(WireModel):
    type: Literal["message"] = "message"
    id: str
    status: ItemStatus
    role: MessageRole
    content: list[ContentPart]
    phase: Phase | None = None
    omit_if_none = frozenset({"phase"})


class FunctionCall(WireModel):
    """``namespace`` (not in the spec, omitted when ``None``): the call is of a function
    of that namespace tool, and ``name`` is the function's own name, as OpenAI answers."""

    omit_if_none = frozenset({"namespace"})
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus
    namespace: str | None = None


class FunctionCallOutput(WireModel):
    type: Literal["function_call_output"] = "function_call_output"
    id: str
    call_id: str
    output: str | list[ToolOutputPart]
    status: ItemStatus


class CustomToolCall(WireModel):
    """A call of a ``custom`` tool, in OpenAI's shape (plus ``status``, which every item
    has). Not in the spec: only a request that offered a ``custom`` tool, and so speaks
    OpenAI's superset, ever gets one."""

    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str
    status: ItemStatus


class CustomToolCallOutput(WireModel):
    type: Literal["custom_tool_call_output"] = "custom_tool_call_output"
    id: str
    call_id: str
    output: str | list[ToolOutputPart]
    status: ItemStatus


class Reasoning(WireModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[SummaryText]
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus
    """Not in the published schema, but the spec requires a status on every item."""
    omit_if_none = frozenset({"content", "encrypted_content"})


class Compaction(WireModel):
    type: Literal["compaction"] = "compaction"
    id: str
    encrypted_content: str
    created_by: str | None = None
    status: ItemStatus = "completed"
    omit_if_none = frozenset({"created_by"})


class ToolSearchCall(WireModel):
    """A tool search, in OpenAI's shape (``created_by`` left out). ``arguments``: what
    the search was asked with; ``call_id``: what its ``tool_search_output`` answers.
    Not in the spec: only a request that offered a ``tool_search`` tool gets one."""

    type: Literal["tool_search_call"] = "tool_search_call"
    id: str
    call_id: str | None
    arguments: dict[str, Any]
    execution: ToolSearchExecution
    status: ItemStatus


class ToolSearchOutput(WireModel):
    """The tools a tool search loaded (definitions as ``tools`` takes them), in OpenAI's
    shape. Not in the spec."""

    type: Literal["tool_search_output"] = "tool_search_output"
    id: str
    call_id: str | None
    execution: ToolSearchExecution
    tools: list[dict[str, Any]]
    status: ItemStatus


OutputItem = Annotated[
    Message | FunctionCall | FunctionCallOutput | Reasoning | Compaction | CustomToolCall | CustomToolCallOutput
    | ToolSearchCall | ToolSearchOutput | McpListTools | McpCall | McpApprovalRequest,
    Field(discriminator="type"),
]
"""The spec's ``ItemField``, and the custom-tool, tool-search and MCP items of OpenAI's superset."""
