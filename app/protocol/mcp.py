"""The items of remote MCP tools (OpenAI's shapes), as sent and as made. Not in the spec:
only a request with an ``mcp`` tool (:class:`~app.protocol.tools.McpToolParam`) gets them.

* ``mcp_list_tools``: the tools a server listed (``error`` if it could not be listed);
  a later turn of the conversation reuses it instead of listing again.
* ``mcp_call``: a call this server made; ``arguments`` is the model's JSON text,
  ``output`` the tool's text, ``error`` why it failed (``status`` ``failed``).
* ``mcp_approval_request``: a call that waits for the client's approval (the response
  ends with it); the client answers with an ``mcp_approval_response`` in its next
  request (``approve``, ``reason``), naming the request's ``id``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from app.protocol.base import ParamModel, WireModel

ItemStatus = Literal["in_progress", "completed", "incomplete"]
McpCallStatus = Literal["in_progress", "completed", "incomplete", "calling", "failed"]


class McpListedTool(ParamModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=dict)
    annotations: dict[str, Any] | None = None


class McpListToolsParam(ParamModel):
    type: Literal["mcp_list_tools"]
    server_label: str
    tools: list[McpListedTool]
    id: str | None = None
    error: str | None = None
    status: McpCallStatus | None = None


class McpCallParam(ParamModel):
    type: Literal["mcp_call"]
    server_label: str
    name: str
    arguments: str
    id: str | None = None
    output: str | None = None
    error: str | None = None
    status: McpCallStatus | None = None
    approval_request_id: str | None = None


class McpApprovalRequestParam(ParamModel):
    type: Literal["mcp_approval_request"]
    server_label: str
    name: str
    arguments: str
    id: str
    status: McpCallStatus | None = None


class McpApprovalResponseParam(ParamModel):
    type: Literal["mcp_approval_response"]
    approval_request_id: str
    approve: bool
    id: str | None = None
    reason: str | None = None


class McpToolInfo(WireModel):
    name: str
    description: str | None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None


class McpListTools(WireModel):
    type: Literal["mcp_list_tools"] = "mcp_list_tools"
    id: str
    server_label: str
    tools: list[McpToolInfo]
    error: str | None = None
    status: ItemStatus = "completed"
    omit_if_none = frozenset({"error"})


class McpCall(WireModel):
    type: Literal["mcp_call"] = "mcp_call"
    id: str
    server_label: str
    name: str
    arguments: str
    output: str | None
    error: str | None
    status: McpCallStatus
    approval_request_id: str | None = None
    omit_if_none = frozenset({"approval_request_id"})


class McpApprovalRequest(WireModel):
    type: Literal["mcp_approval_request"] = "mcp_approval_request"
    id: str
    server_label: str
    name: str
    arguments: str
    status: ItemStatus = "completed"
