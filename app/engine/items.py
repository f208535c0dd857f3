"""Input items as they are stored and listed, and back.

Clients may send items in short forms (a string ``content``, no ``id``); stored items are
always in the full wire form of the spec's ``ItemField``: an ``id``, a ``status`` and
content as a list of parts. Output items are already in that form. Both are read back
into params with the same adapter that parses requests, so a chain's history reaches the
model exactly as a re-sent history would.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from app.engine import ids
from app.protocol.items import (
    AssistantMessageParam,
    CompactionParam,
    CustomToolCallOutputParam,
    CustomToolCallParam,
    DeveloperMessageParam,
    FunctionCallOutputParam,
    FunctionCallParam,
    ItemParam,
    ReasoningParam,
    SystemMessageParam,
    ToolSearchCallParam,
    ToolSearchOutputParam,
    UserMessageParam,
)
from app.protocol.mcp import McpApprovalRequestParam, McpApprovalResponseParam, McpCallParam, McpListToolsParam
from app.protocol.states import ItemStatus, ItemType

_ITEMS: TypeAdapter[Any] = TypeAdapter(ItemParam)

JSON = dict[str, Any]


def stored_form(item: object) -> JSON:
    """The wire form of an input item param, with an ``id`` (assigned if missing)."""
    if isinstance(item, UserMessageParam | SystemMessageParam | DeveloperMessageParam):
        content = (
            [{"type": "input_text", "text": item.content}]
            if isinstance(item.content, str)
            else [part.model_dump(exclude_none=True) for part in item.content]
        )
        return {"type": ItemType.MESSAGE, "id": item.id or ids.message_id(), "status": ItemStatus.COMPLETED,
                "role": item.role, "content": content}
    if isinstance(item, AssistantMessageParam):
        content = (
            [{"type": "output_text", "text": item.content, "annotations": []}]
            if isinstance(item.content, str)
            else [_assistant_part(part.model_dump(exclude_none=True)) for part in item.content]
        )
        stored = {"type": ItemType.MESSAGE, "id": item.id or ids.message_id(),
                  "status": item.status or ItemStatus.COMPLETED, "role": "assistant", "content": content}
        if item.phase is not None:
            stored["phase"] = item.phase
        return stored
    if isinstance(item, FunctionCallParam):
        return item.model_dump(exclude_none=True) | {"id": item.id or ids.function_call_id()}
    if isinstance(item, FunctionCallOutputParam):
        return item.model_dump(exclude_none=True) | {
            "id": item.id or ids.function_call_output_id(),
            "status": item.status or ItemStatus.COMPLETED,
        }
    if isinstance(item, CustomToolCallParam):
        return item.model_dump(exclude_none=True) | {
            "id": item.id or ids.custom_tool_call_id(),
            "status": item.status or ItemStatus.COMPLETED,
        }
    if isinstance(item, CustomToolCallOutputParam):
        return item.model_dump(exclude_none=True) | {
            "id": item.id or ids.custom_tool_call_output_id(),
            "status": item.status or ItemStatus.COMPLETED,
        }
    if isinstance(item, ReasoningParam):
        return item.model_dump(exclude_none=True) | {"id": item.id or ids.reasoning_id()}
    if isinstance(item, CompactionParam):
        return item.model_dump(exclude_none=True) | {"id": item.id or ids.compaction_id()}
    if isinstance(item, ToolSearchCallParam | ToolSearchOutputParam):
        made = ids.tool_search_call_id if isinstance(item, ToolSearchCallParam) else ids.tool_search_output_id
        return item.model_dump(exclude_none=True) | {
            "id": item.id or made(),
            "call_id": item.call_id,
            "execution": item.execution or "server",  # OpenAI's default
            "status": item.status or ItemStatus.COMPLETED,
        }
    if isinstance(item, McpListToolsParam | McpCallParam | McpApprovalRequestParam | McpApprovalResponseParam):
        return item.model_dump(exclude_none=True) | {"id": item.id or ids.new_id(_MCP_PREFIXES[item.type])}
    raise TypeError(f"{type(item).__name__} is not stored as an item")


_MCP_PREFIXES = {"mcp_list_tools": "mcpl", "mcp_call": "mcp", "mcp_approval_request": "mcpr",
                 "mcp_approval_response": "mcpa"}


def _assistant_part(part: JSON) -> JSON:
    if part.get("type") == "output_text":
        part.setdefault("annotations", [])
        part.pop("logprobs", None)
    return part


def from_stored(item: JSON) -> object:
    """A stored item (input or output) as the param the context builder takes."""
    return _ITEMS.validate_python(item)
