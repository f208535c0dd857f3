"""A real MCP server for end-to-end tests: the SDK's ``MCPServer`` with five tools
(``add``, ``lookup``, ``repeat``, ``slow``, ``broken``, which raises), served by uvicorn on 127.0.0.1, a free
port, both as streamable HTTP (``/mcp``) and as SSE (``/sse``, a port of its own).
It counts the JSON-RPC methods it is asked for and keeps the headers it was sent."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer

WORDS = {"ors": "an Open Responses server", "mcp": "the Model Context Protocol"}


def make_server() -> MCPServer:
    server = MCPServer("calc")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def lookup(word: str) -> str:
        """Look a word up."""
        return WORDS.get(word.lower(), "unknown word")

    @server.tool()
    def repeat(word: str, times: int) -> str:
        """Repeat a word."""
        return word * times

    @server.tool()
    async def slow(seconds: float) -> str:
        """Answer after a while."""
        await asyncio.sleep(seconds)
        return "late"

    @server.tool()
    def broken() -> str:
        """Always fails."""
        raise ValueError("the tool broke")

    return server


class Counting:
    """ASGI middleware: counts each JSON-RPC ``method`` posted, keeps each request's headers."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.methods: collections.Counter[str] = collections.Counter()
        self.headers: list[dict[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        chunks: list[bytes] = []

        async def tapped() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    self._count(b"".join(chunks))
            return message

        await self.app(scope, tapped, send)

    def _count(self, body: bytes) -> None:
        try:
            value = json.loads(body) if body else None
        except ValueError:
            return
        for message in value if isinstance(value, list) else [value]:
            if isinstance(message, dict) and isinstance(message.get("method"), str):
                self.methods[message["method"]] += 1


class McpServers:
    """Both transports of one server, each on its own port, until :meth:`stop`."""

    def __init__(self) -> None:
        server = make_server()
        self.http = Counting(server.streamable_http_app())
        self.sse = Counting(server.sse_app())
        self._servers = [uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
                         for app in (self.http, self.sse)]
        self._threads = [threading.Thread(target=s.run, daemon=True) for s in self._servers]

    def start(self) -> McpServers:
        for thread in self._threads:
            thread.start()
        deadline = time.monotonic() + 60
        while not all(s.started for s in self._servers):
            if time.monotonic() > deadline:
                raise TimeoutError("the MCP servers did not start")
            time.sleep(0.02)
        self.ports = [s.servers[0].sockets[0].getsockname()[1] for s in self._servers]
        return self

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}/mcp"

    @property
    def sse_url(self) -> str:
        return f"http://127.0.0.1:{self.ports[1]}/sse"

    def lists(self) -> int:
        return self.http.methods["tools/list"] + self.sse.methods["tools/list"]

    def stop(self) -> None:
        for server in self._servers:
            server.should_exit = True
        for thread in self._threads:
            thread.join(timeout=30)
