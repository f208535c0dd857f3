"""The MCP items a response reports, and their events, made from the MCP loop's deltas
(:mod:`app.engine.mcp_loop`); the builder's :class:`~app.engine.output_items.OutputItems`
hands them here.

* ``mcp_list_tools`` and ``mcp_approval_request`` are whole when their delta comes:
  ``output_item.added`` with the zero value (``tools: []``), the listing's
  ``response.mcp_list_tools.in_progress`` and ``.completed`` (``.failed`` with an
  ``error``), then ``output_item.done``.
* ``mcp_call`` comes in two deltas. The first (``running``) opens it:
  ``output_item.added`` (``arguments: ""``, ``in_progress``), the arguments' delta and
  done events, ``response.mcp_call.in_progress``; the item stays open while the server
  is asked. The second closes it: ``response.mcp_call.completed`` or ``.failed``, then
  ``output_item.done`` with the ``output`` or ``error`` (status ``failed``). A call still
  open when the response ends early is closed (or abandoned) ``incomplete``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.backends.base import McpApprovalRequestDelta, McpCallDelta, McpListToolsDelta
from app.engine import ids
from app.protocol.events import OutputItemAdded, OutputItemDone
from app.protocol.items import OutputItem
from app.protocol.mcp import McpApprovalRequest, McpCall, McpListTools, McpToolInfo
from app.protocol.mcp_events import (
    McpCallArgumentsDelta,
    McpCallArgumentsDone,
    McpCallCompleted,
    McpCallFailed,
    McpCallInProgress,
    McpListToolsCompleted,
    McpListToolsFailed,
    McpListToolsInProgress,
)
from app.protocol.states import ItemStatus

if TYPE_CHECKING:
    from app.engine.output_items import EventMaker

McpDelta = McpListToolsDelta | McpCallDelta | McpApprovalRequestDelta


class McpItems:
    """The MCP items of one response, appended to its ``closed`` items (the builder's)."""

    __slots__ = ("_events", "_closed", "_call", "_index")

    def __init__(self, events: EventMaker, closed: list[OutputItem]) -> None:
        self._events = events
        self._closed = closed
        self._call: McpCall | None = None
        """The call being made, as added."""
        self._index = 0

    @property
    def open(self) -> bool:
        return self._call is not None

    def feed(self, delta: McpDelta) -> None:
        """Apply one delta (the open item of the builder, if any, already closed)."""
        add, index = self._events.add, len(self._closed)
        if isinstance(delta, McpCallDelta):
            if delta.running:
                self._begin(delta)
            else:
                if self._call is None:
                    self._begin(delta)
                self._end(delta)
            return
        if isinstance(delta, McpListToolsDelta):
            item_id = ids.new_id("mcpl")
            tools = [McpToolInfo(name=tool.name, description=tool.description, input_schema=tool.input_schema,
                                 annotations=tool.annotations) for tool in delta.tools]
            add(OutputItemAdded, output_index=index,
                item=McpListTools(id=item_id, server_label=delta.server_label, tools=[], status="in_progress"))
            add(McpListToolsInProgress, item_id=item_id, output_index=index)
            add(McpListToolsFailed if delta.error is not None else McpListToolsCompleted, item_id=item_id,
                output_index=index)
            final: OutputItem = McpListTools(id=item_id, server_label=delta.server_label, tools=tools,
                                             error=delta.error)
        else:
            fields = {"id": delta.item_id, "server_label": delta.server_label, "name": delta.name,
                      "arguments": delta.arguments}
            add(OutputItemAdded, output_index=index, item=McpApprovalRequest(**fields, status="in_progress"))
            final = McpApprovalRequest(**fields)
        self._closed.append(final)
        add(OutputItemDone, output_index=index, item=final)

    def _begin(self, delta: McpCallDelta) -> None:
        add, index = self._events.add, len(self._closed)
        call = self._call = McpCall(id=ids.new_id("mcp"), server_label=delta.server_label, name=delta.name,
                                    arguments="", output=None, error=None, status="in_progress",
                                    approval_request_id=delta.approval_request_id)
        self._index = index
        add(OutputItemAdded, output_index=index, item=call)
        add(McpCallArgumentsDelta, item_id=call.id, output_index=index, delta=delta.arguments)
        add(McpCallArgumentsDone, item_id=call.id, output_index=index, arguments=delta.arguments)
        add(McpCallInProgress, item_id=call.id, output_index=index)

    def _end(self, delta: McpCallDelta) -> None:
        call, self._call = self._call, None
        assert call is not None
        failed = delta.error is not None
        self._events.add(McpCallFailed if failed else McpCallCompleted, item_id=call.id, output_index=self._index)
        final = call.model_copy(update={"arguments": delta.arguments, "output": delta.output, "error": delta.error,
                                        "status": "failed" if failed else "completed"})
        self._closed.append(final)
        self._events.add(OutputItemDone, output_index=self._index, item=final)

    def close(self) -> None:
        """Close a call still open ``incomplete`` (the response ends early)."""
        final = self.abandon()
        if final:
            self._closed.append(final[0])
            self._events.add(OutputItemDone, output_index=self._index, item=final[0])

    def abandon(self) -> list[OutputItem]:
        """A call still open as an ``incomplete`` item, without events."""
        call, self._call = self._call, None
        return [] if call is None else [call.model_copy(update={"status": ItemStatus.INCOMPLETE})]
