"""The one place this server speaks MCP, as a client, with the official SDK (``mcp``).

Each operation (:func:`list_tools`, :func:`call_tool`) opens a session of its own to the
server (streamable HTTP; the SSE transport when the URL's path ends in ``/sse``),
initializes it, asks, and closes it, all within ``seconds`` (the connection included).
The HTTP client sends the tool's ``headers`` and ``authorization`` (as a bearer token) to
that server only, follows no redirect off the endpoint's origin (the SDK's transports
follow only same-origin ones themselves; the client's own following is off), and nothing
of them is logged here. Every failure is an :class:`McpFailure` whose message is safe to
show the client and the model (it names what failed, never a header).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from app.backends.base import McpTool

log = logging.getLogger("ors.mcp")


class McpFailure(Exception):
    """An MCP server could not be reached, or answered with an error."""


@dataclass(frozen=True)
class McpServer:
    """Where a server is and what it is sent (the secrets never leave this object)."""

    url: str
    headers: Mapping[str, str]
    seconds: float


@dataclass(frozen=True)
class McpResult:
    output: str
    is_error: bool


async def list_tools(server: McpServer) -> list[McpTool]:
    """The server's tools (every page of them)."""
    async with _session(server) as session:
        tools: list[McpTool] = []
        cursor: str | None = None
        while True:
            listed = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
            for tool in listed.tools:
                annotations = tool.annotations.model_dump(mode="json", exclude_none=True) if tool.annotations else None
                tools.append(McpTool(tool.name, tool.description, dict(tool.input_schema), annotations or None))
            cursor = listed.next_cursor
            if not cursor:
                return tools


async def call_tool(server: McpServer, name: str, arguments: dict[str, Any]) -> McpResult:
    """The call's output as text (text parts joined; other parts as their JSON)."""
    async with _session(server) as session:
        result = await session.call_tool(name, arguments, read_timeout_seconds=server.seconds)
    if not isinstance(result, CallToolResult):
        raise McpFailure(f"the MCP server answered the call of {name!r} with a {type(result).__name__}")
    parts = [part.text if isinstance(part, TextContent) else json.dumps(part.model_dump(mode="json"))
             for part in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return McpResult("\n".join(parts), bool(result.is_error))


@contextlib.asynccontextmanager
async def _session(server: McpServer) -> AsyncIterator[ClientSession]:
    try:
        async with asyncio.timeout(server.seconds), contextlib.AsyncExitStack() as stack:
            if _is_sse(server.url):
                def factory(headers: dict[str, str] | None = None, timeout: httpx2.Timeout | None = None,
                            auth: httpx2.Auth | None = None) -> httpx2.AsyncClient:
                    return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, follow_redirects=False)
                read, write = await stack.enter_async_context(sse_client(
                    server.url, headers=dict(server.headers), timeout=server.seconds,
                    sse_read_timeout=server.seconds, httpx_client_factory=factory))
            else:
                client = await stack.enter_async_context(httpx2.AsyncClient(
                    headers=dict(server.headers), timeout=httpx2.Timeout(server.seconds), follow_redirects=False))
                streams = await stack.enter_async_context(streamable_http_client(server.url, http_client=client))
                read, write = streams[0], streams[1]
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            yield session
    except McpFailure:
        raise
    except TimeoutError:
        raise McpFailure(f"the MCP server did not answer within {server.seconds:g} s") from None
    except Exception as error:  # noqa: BLE001 - any failure of the server or the SDK is the call's
        raise McpFailure(_described(error)) from None


def _is_sse(url: str) -> bool:
    return httpx2.URL(url).path.rstrip("/").endswith("/sse")


def _described(error: BaseException) -> str:
    """A failure in words: the innermost of an exception group; an MCP error's message."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    if isinstance(error, httpx2.HTTPStatusError):
        return f"the MCP server answered HTTP {error.response.status_code}"
    if isinstance(error, httpx2.HTTPError):
        return f"the MCP server could not be reached ({type(error).__name__})"
    text = str(error).strip() or type(error).__name__
    return text[:500]
