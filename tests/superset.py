"""Schemas of OpenAI superset items this server makes, for judging them by every other
rule of the spec (``compliance.with_items``): the tool search items, in the shape OpenAI
documents (``call_id`` may be null; ``created_by`` is never written here); and the remote
MCP items (``mcp_list_tools``, ``mcp_call``, ``mcp_approval_request``) in OpenAI's shapes."""

from __future__ import annotations

import functools
from typing import Any

from compliance.schemas import Spec, load_spec, with_items

_STATUS = {"type": "string", "enum": ["in_progress", "completed", "incomplete"]}
_EXECUTION = {"type": "string", "enum": ["server", "client"]}
_CALL_ID = {"type": ["string", "null"]}

TOOL_SEARCH_ITEMS: dict[str, dict[str, Any]] = {
    "ToolSearchCall": {
        "type": "object",
        "properties": {"type": {"enum": ["tool_search_call"]}, "id": {"type": "string"}, "call_id": _CALL_ID,
                       "arguments": {"type": "object"}, "execution": _EXECUTION, "status": _STATUS},
        "required": ["type", "id", "call_id", "arguments", "execution", "status"],
        "additionalProperties": False,
    },
    "ToolSearchOutput": {
        "type": "object",
        "properties": {"type": {"enum": ["tool_search_output"]}, "id": {"type": "string"}, "call_id": _CALL_ID,
                       "execution": _EXECUTION, "status": _STATUS,
                       "tools": {"type": "array", "items": {"type": "object", "required": ["type"]}}},
        "required": ["type", "id", "call_id", "execution", "tools", "status"],
        "additionalProperties": False,
    },
}


@functools.cache
def tool_search_spec() -> Spec:
    """The vendored spec with the tool search items in its item union."""
    return with_items(load_spec(), TOOL_SEARCH_ITEMS)


_TEXT_OR_NULL = {"type": ["string", "null"]}

MCP_ITEMS: dict[str, dict[str, Any]] = {
    "McpListTools": {
        "type": "object",
        "properties": {"type": {"enum": ["mcp_list_tools"]}, "id": {"type": "string"},
                       "server_label": {"type": "string"}, "error": _TEXT_OR_NULL,
                       "tools": {"type": "array", "items": {
                           "type": "object",
                           "properties": {"name": {"type": "string"}, "description": _TEXT_OR_NULL,
                                          "input_schema": {"type": "object"},
                                          "annotations": {"type": ["object", "null"]}},
                           "required": ["name", "input_schema"], "additionalProperties": False}},
                       "status": _STATUS},
        "required": ["type", "id", "server_label", "tools", "status"],
        "additionalProperties": False,
    },
    "McpCall": {
        "type": "object",
        "properties": {"type": {"enum": ["mcp_call"]}, "id": {"type": "string"}, "server_label": {"type": "string"},
                       "name": {"type": "string"}, "arguments": {"type": "string"}, "output": _TEXT_OR_NULL,
                       "error": _TEXT_OR_NULL, "approval_request_id": _TEXT_OR_NULL,
                       "status": {"enum": ["in_progress", "completed", "incomplete", "calling", "failed"]}},
        "required": ["type", "id", "server_label", "name", "arguments", "status"],
        "additionalProperties": False,
    },
    "McpApprovalRequest": {
        "type": "object",
        "properties": {"type": {"enum": ["mcp_approval_request"]}, "id": {"type": "string"},
                       "server_label": {"type": "string"}, "name": {"type": "string"},
                       "arguments": {"type": "string"}, "status": _STATUS},
        "required": ["type", "id", "server_label", "name", "arguments", "status"],
        "additionalProperties": False,
    },
}


def _item_event(kind: str, **more: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object",
            "properties": {"type": {"enum": [kind]}, "sequence_number": {"type": "integer"},
                           "item_id": {"type": "string"}, "output_index": {"type": "integer"}, **more},
            "required": ["type", "sequence_number", "item_id", "output_index", *more],
            "additionalProperties": False}


MCP_EVENTS: dict[str, dict[str, Any]] = {
    **{f"McpListTools{step.title().replace('_', '')}Event": _item_event(f"response.mcp_list_tools.{step}")
       for step in ("in_progress", "completed", "failed")},
    **{f"McpCall{step.title().replace('_', '')}Event": _item_event(f"response.mcp_call.{step}")
       for step in ("in_progress", "completed", "failed")},
    "McpCallArgumentsDeltaEvent": _item_event("response.mcp_call_arguments.delta", delta={"type": "string"}),
    "McpCallArgumentsDoneEvent": _item_event("response.mcp_call_arguments.done", arguments={"type": "string"}),
}


@functools.cache
def mcp_spec() -> Spec:
    """The vendored spec with the remote MCP items in its item union and their events in
    its streaming union."""
    return with_items(load_spec(), MCP_ITEMS, MCP_EVENTS)
