"""The MCP items a response reports, made from the MCP loop's deltas
(:mod:`app.engine.mcp_loop`): each is whole when its delta comes, so the builder gives
it ``output_item.added`` with its zero value, then ``output_item.done`` with the item."""

from __future__ import annotations

from app.backends.base import McpApprovalRequestDelta, McpCallDelta, McpListToolsDelta
from app.engine import ids
from app.protocol.mcp import McpApprovalRequest, McpCall, McpListTools, McpToolInfo

McpItem = McpListTools | McpCall | McpApprovalRequest
McpDelta = McpListToolsDelta | McpCallDelta | McpApprovalRequestDelta


def mcp_items(delta: McpDelta) -> tuple[McpItem, McpItem]:
    """The item's zero value (``output_item.added``) and the item itself."""
    if isinstance(delta, McpListToolsDelta):
        item_id = ids.new_id("mcpl")
        tools = [McpToolInfo(name=tool.name, description=tool.description, input_schema=tool.input_schema,
                             annotations=tool.annotations) for tool in delta.tools]
        return (McpListTools(id=item_id, server_label=delta.server_label, tools=[], status="in_progress"),
                McpListTools(id=item_id, server_label=delta.server_label, tools=tools, error=delta.error))
    if isinstance(delta, McpCallDelta):
        item_id = ids.new_id("mcp")
        fields = {"id": item_id, "server_label": delta.server_label, "name": delta.name,
                  "approval_request_id": delta.approval_request_id}
        return (McpCall(**fields, arguments="", output=None, error=None, status="in_progress"),
                McpCall(**fields, arguments=delta.arguments, output=delta.output, error=delta.error,
                        status="failed" if delta.error is not None else "completed"))
    fields = {"id": delta.item_id, "server_label": delta.server_label, "name": delta.name,
              "arguments": delta.arguments}
    return McpApprovalRequest(**fields, status="in_progress"), McpApprovalRequest(**fields)
