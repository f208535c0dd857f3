"""Remote MCP tools (``{"type": "mcp", ...}``): which servers may be reached, and the
budgets of the calls this server makes to them.

No open relay: a request's ``server_url`` must be covered by ``ORS_MCP_ALLOWED_URLS``
(an :class:`~app.url_roots.AllowList`: URL roots on segment boundaries, or bare hosts),
checked before any stream. With the list empty (the default) MCP is off and any ``mcp``
tool is a 400 naming the setting (``param`` ``tools[i]``); a URL not covered is a 400 on
``tools[i].server_url``. Host names are not resolved: a listed name is the operator's, so
loopback and private addresses are reached only when listed. Redirects are never
followed (the clients are made with ``follow_redirects`` off).

What happens at run time (listing, calling, approvals) is :mod:`app.engine.mcp_loop`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from app.backends.base import McpTool
from app.errors import InvalidRequest
from app.protocol.mcp import McpApprovalRequestParam, McpApprovalResponseParam, McpListToolsParam
from app.protocol.responses import CreateResponseBody
from app.protocol.tools import McpToolChoiceParam, McpToolParam
from app.url_roots import AllowList, UrlRoot

DEFAULT_MAX_CALLS = 16
DEFAULT_CALL_SECONDS = 60.0
DEFAULT_MAX_OUTPUT_BYTES = 65_536


@dataclass(frozen=True)
class McpLimits:
    """Where MCP servers may be and what one response may ask of them."""

    allowed: AllowList = field(default_factory=lambda: AllowList(()))
    max_calls: int = DEFAULT_MAX_CALLS
    """Tool calls one response makes at most; a further call the model asks for is not
    run, and the response ends there."""
    call_seconds: float = DEFAULT_CALL_SECONDS
    """Seconds one call (or one listing, connection included) may take."""
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    """UTF-8 bytes of one call's output kept; past them it is cut, with a note."""


def check_mcp_tools(body: CreateResponseBody, limits: McpLimits) -> list[McpToolParam]:
    """The request's MCP tools, each allowed (else the 400s of the module docstring), and
    their labels unique (400 on the second one's ``server_label``)."""
    found: list[McpToolParam] = []
    labels: set[str] = set()
    for index, tool in enumerate(body.tools or []):
        if not isinstance(tool, McpToolParam):
            continue
        if not limits.allowed:
            raise InvalidRequest(
                "MCP tools are off on this server: its operator lists the MCP servers it may reach in "
                "ORS_MCP_ALLOWED_URLS.", code="mcp_not_allowed", param=f"tools[{index}]")
        try:
            url = UrlRoot.parse(tool.server_url)
        except ValueError as error:
            raise InvalidRequest(f"Invalid value for 'server_url': {error}.", code="invalid_value",
                                 param=f"tools[{index}].server_url") from None
        if not limits.allowed.covers(url):
            raise InvalidRequest(
                f"This server may not reach the MCP server {url.url()}: it is not listed in ORS_MCP_ALLOWED_URLS.",
                code="mcp_url_not_allowed", param=f"tools[{index}].server_url")
        if tool.server_label in labels:
            raise InvalidRequest(f"Two MCP tools have the server_label {tool.server_label!r}.",
                                 code="invalid_value", param=f"tools[{index}].server_label")
        labels.add(tool.server_label)
        found.append(tool)
    choice = body.tool_choice
    if isinstance(choice, McpToolChoiceParam) and choice.server_label not in labels:
        raise InvalidRequest(f"tool_choice names the MCP server {choice.server_label!r}, which is not in 'tools'.",
                             code="invalid_value", param="tool_choice.server_label")
    return found


def mcp_result_text(output: str | None, error: str | None) -> str:
    """What the model reads of a call: its output, or why it failed."""
    if error is not None:
        return f"The MCP tool call failed: {error}" + (f"\n{output}" if output else "")
    return output or ""


def chain_listings(items: Iterable[object]) -> dict[str, tuple[McpTool, ...]]:
    """The tools each server listed in the conversation (its last listing without an
    error, by ``server_label``), reused rather than listed again."""
    listed: dict[str, tuple[McpTool, ...]] = {}
    for item in items:
        if isinstance(item, McpListToolsParam) and item.error is None:
            listed[item.server_label] = tuple(
                McpTool(tool.name, tool.description, tool.input_schema, tool.annotations) for tool in item.tools)
    return listed


def approvals_of(past: Iterable[object], new: Sequence[object],
                 tools: Sequence[McpToolParam]) -> list[tuple[McpApprovalRequestParam, McpApprovalResponseParam]]:
    """The new ``mcp_approval_response`` items, each with the request it answers (a 400
    on its ``approval_request_id`` for a request the conversation does not hold, or of
    a server not in this request's tools)."""
    asked = {item.id: item for item in past if isinstance(item, McpApprovalRequestParam)}
    asked.update((item.id, item) for item in new if isinstance(item, McpApprovalRequestParam))
    labels = {tool.server_label for tool in tools}
    pairs = []
    for index, item in enumerate(new):
        if not isinstance(item, McpApprovalResponseParam):
            continue
        request = asked.get(item.approval_request_id)
        if request is None:
            raise InvalidRequest(f"No mcp_approval_request {item.approval_request_id!r} in this conversation.",
                                 code="invalid_value", param=f"input[{index}].approval_request_id")
        if request.server_label not in labels:
            raise InvalidRequest(f"The approved call is of the MCP server {request.server_label!r}, which is not "
                                 "in this request's tools.", code="invalid_value",
                                 param=f"input[{index}].approval_request_id")
        pairs.append((request, item))
    return pairs
