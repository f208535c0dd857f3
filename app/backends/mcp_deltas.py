"""The deltas of OpenAI's MCP items (``mcp_list_tools``, ``mcp_call``,
``mcp_approval_request``), part of the delta vocabulary of :mod:`app.backends.base`
(which re-exports them). Only the engine's MCP loop (:mod:`app.engine.mcp_loop`) makes
them, never a model backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class McpTool:
    """A tool an MCP server listed."""

    name: str
    description: str | None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class McpListToolsDelta:
    """A server's tools as listed (``mcp_list_tools``), or why they could not be."""

    server_label: str
    tools: tuple[McpTool, ...]
    error: str | None = None


@dataclass(frozen=True, slots=True)
class McpCallDelta:
    """A call of an MCP tool made by the server (``mcp_call``): ``running`` as it is
    made, then again with how it ended (``output``, or ``error``)."""

    server_label: str
    name: str
    arguments: str
    output: str | None = None
    error: str | None = None
    approval_request_id: str | None = None
    running: bool = False


@dataclass(frozen=True, slots=True)
class McpApprovalRequestDelta:
    """A call of an MCP tool that waits for the client's approval (``mcp_approval_request``)."""

    item_id: str
    server_label: str
    name: str
    arguments: str
