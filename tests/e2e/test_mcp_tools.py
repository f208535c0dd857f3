"""Remote MCP tools (``{"type": "mcp"}``) end to end: a real MCP server (the SDK's
``MCPServer``, ``tests.mcp_server``, over streamable HTTP and SSE) and the real ors
server. Scripted models (named as such) call the MCP tools deterministically; every
response and event is judged by the vendored spec with the MCP items added
(``tests.superset``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.main import create_app
from tests.client import Client
from tests.live import LiveServer
from tests.mcp_server import McpServers

SCRIPTED = ScriptedBackend({"scripted-mcp-text": ["Hello."]})


@pytest.fixture(scope="module")
def mcp_servers() -> Iterator[McpServers]:
    servers = McpServers().start()
    yield servers
    servers.stop()


def _serve(data: Path, **settings: Any) -> LiveServer:
    return LiveServer(create_app(Settings(data_dir=data, default_model="scripted-mcp-text", **settings),
                                 backends=[SCRIPTED])).start()


@pytest.fixture(scope="module")
def closed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = _serve(tmp_path_factory.mktemp("mcp-off"))
    yield server
    server.stop()


def _tool(url: str, **more: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "calc", "server_url": url, **more}


# ---------------------------------------------------------------- no open relay


def test_mcp_is_off_by_default_and_the_error_names_the_setting(closed_server: LiveServer,
                                                               mcp_servers: McpServers) -> None:
    with Client(closed_server.url) as client:
        error = client.error({"input": "hi", "tools": [{"type": "function", "name": "f"},
                                                       _tool(mcp_servers.http_url)]}, 400)
    assert error["param"] == "tools[1]"
    assert "ORS_MCP_ALLOWED_URLS" in error["message"]


@pytest.mark.parametrize(("allowed", "url"), [
    ("https://mcp.example.com/tools", "https://mcp.example.com/toolsets/x"),  # a segment boundary
    ("https://mcp.example.com/tools", "http://mcp.example.com/tools"),  # the scheme
    ("https://mcp.example.com/tools", "https://mcp.example.com:8443/tools"),  # the port
    ("mcp.example.com:8000", "http://mcp.example.com:8001/mcp"),
    ("mcp.example.com", "http://127.0.0.1/mcp"),  # loopback only when listed
    ("mcp.example.com", "http://mcp.example.com.evil.test/mcp"),
])
def test_a_url_not_listed_is_refused_naming_its_param(tmp_path: Path, allowed: str, url: str) -> None:
    server = _serve(tmp_path, mcp_allowed_urls=allowed)
    try:
        with Client(server.url) as client:
            error = client.error({"input": "hi", "tools": [_tool(url)]}, 400)
    finally:
        server.stop()
    assert (error["param"], error["code"]) == ("tools[0].server_url", "mcp_url_not_allowed")


def test_a_url_with_credentials_is_refused(closed_server: LiveServer, tmp_path: Path) -> None:
    server = _serve(tmp_path, mcp_allowed_urls="mcp.example.com")
    try:
        with Client(server.url) as client:
            error = client.error({"input": "hi", "tools": [_tool("http://user:pw@mcp.example.com/mcp")]}, 400)
    finally:
        server.stop()
    assert error["param"] == "tools[0].server_url"
