"""The streaming events of remote MCP items, in OpenAI's shapes. Not in the spec (nor in
its :data:`~app.protocol.events.Event` union): only a request with an ``mcp`` tool gets
them, each between its item's ``output_item.added`` and ``output_item.done``.

* ``mcp_list_tools``: ``response.mcp_list_tools.in_progress``, then ``.completed`` or
  ``.failed``.
* ``mcp_call``: ``response.mcp_call_arguments.delta`` and ``.done`` (the model's
  arguments, whole), ``response.mcp_call.in_progress`` while the server is asked, then
  ``response.mcp_call.completed`` or ``.failed``.
"""

from __future__ import annotations

from typing import Literal

from app.protocol.events import StreamEvent


class _ItemEvent(StreamEvent):
    item_id: str
    output_index: int


class McpListToolsInProgress(_ItemEvent):
    type: Literal["response.mcp_list_tools.in_progress"] = "response.mcp_list_tools.in_progress"


class McpListToolsCompleted(_ItemEvent):
    type: Literal["response.mcp_list_tools.completed"] = "response.mcp_list_tools.completed"


class McpListToolsFailed(_ItemEvent):
    type: Literal["response.mcp_list_tools.failed"] = "response.mcp_list_tools.failed"


class McpCallArgumentsDelta(_ItemEvent):
    type: Literal["response.mcp_call_arguments.delta"] = "response.mcp_call_arguments.delta"
    delta: str


class McpCallArgumentsDone(_ItemEvent):
    type: Literal["response.mcp_call_arguments.done"] = "response.mcp_call_arguments.done"
    arguments: str


class McpCallInProgress(_ItemEvent):
    type: Literal["response.mcp_call.in_progress"] = "response.mcp_call.in_progress"


class McpCallCompleted(_ItemEvent):
    type: Literal["response.mcp_call.completed"] = "response.mcp_call.completed"


class McpCallFailed(_ItemEvent):
    type: Literal["response.mcp_call.failed"] = "response.mcp_call.failed"
