"""The names of states and kinds the protocol defines, as enums.

Each is a :class:`~enum.StrEnum`: a member *is* its wire string (``ResponseStatus.COMPLETED
== "completed"``), so it goes into JSON, SQL and comparisons as the string the spec names,
and code that names a state names a member instead of repeating a literal. The wire models
keep ``Literal`` types of the same strings (pydantic validates and serializes those as plain
strings, whether a member or a string is put in); ``tests/protocol/test_states.py`` holds
the two equal.

* :class:`ResponseStatus`: a response's ``status``. ``queued`` and ``in_progress`` are
  open; the others are final, and a response that reached one never leaves it.
* :class:`ItemStatus`: an output item's ``status``: ``in_progress`` while it streams, then
  ``completed`` or ``incomplete`` (never back).
* :class:`ItemType`: the ``type`` of the items this server reads and writes.
"""

from __future__ import annotations

from enum import StrEnum


class ResponseStatus(StrEnum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    INCOMPLETE = "incomplete"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        """Whether a response in this status has ended (it never changes again)."""
        return self not in (ResponseStatus.QUEUED, ResponseStatus.IN_PROGRESS)


class ItemStatus(StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"


class ItemType(StrEnum):
    MESSAGE = "message"
    FUNCTION_CALL = "function_call"
    FUNCTION_CALL_OUTPUT = "function_call_output"
    CUSTOM_TOOL_CALL = "custom_tool_call"
    CUSTOM_TOOL_CALL_OUTPUT = "custom_tool_call_output"
    REASONING = "reasoning"
    COMPACTION = "compaction"
    COMPACTION_TRIGGER = "compaction_trigger"
    ITEM_REFERENCE = "item_reference"
    TOOL_SEARCH_CALL = "tool_search_call"
    TOOL_SEARCH_OUTPUT = "tool_search_output"
    MCP_LIST_TOOLS = "mcp_list_tools"
    MCP_CALL = "mcp_call"
    MCP_APPROVAL_REQUEST = "mcp_approval_request"
    MCP_APPROVAL_RESPONSE = "mcp_approval_response"
