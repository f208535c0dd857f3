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

from dataclasses import dataclass, field

from app.errors import InvalidRequest
from app.protocol.responses import CreateResponseBody
from app.protocol.tools import McpToolParam
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
    return found
