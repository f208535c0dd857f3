"""What keeps the playground safe, over real HTTP and WebSocket: its page's headers, its
files only, ``ORS_UI=false``, a browser's key as a WebSocket subprotocol, and the Origin
guard that admits the server's own page and no other site's. The scripted backend
(named as such) answers: none of this depends on a model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from app.config import Settings
from app.main import create_app
from app.transport.ui import CSP
from compliance import validate_error_body
from tests.conftest import scripted_backend
from tests.live import LiveServer

SECRET = "ui-secret"


def serve(tmp_path: Path, **settings: object) -> LiveServer:
    values = {"data_dir": tmp_path, "default_model": "scripted-text", "api_keys": [f"ui:{SECRET}"], **settings}
    return LiveServer(create_app(Settings(**values), backends=[scripted_backend()])).start()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = serve(tmp_path_factory.mktemp("ui-guards"))
    yield live
    live.stop()


def test_the_page_and_its_files_are_served_with_a_strict_policy(server: LiveServer) -> None:
    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CSP
    assert "script-src 'self';" in CSP and "unsafe-inline" not in CSP and "unsafe-eval" not in CSP
    assert page.headers["x-content-type-options"] == "nosniff"
    assert '<script type="module" src="/ui/js/main.js">' in page.text and "http" not in page.text.split("<body>")[0]
    script = httpx.get(f"{server.url}/ui/js/main.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.headers["x-content-type-options"] == "nosniff"
    for outside in ("/ui/../transport/ui.py", "/ui/%2e%2e/transport/ui.py", "/ui/nothing.js"):
        assert httpx.get(f"{server.url}{outside}").status_code == 404


def test_ui_false_turns_the_page_and_its_runs_off(tmp_path: Path) -> None:
    live = serve(tmp_path, ui=False)
    try:
        for method, path in (("GET", "/"), ("GET", "/ui/app.css"), ("POST", "/ors/checks")):
            reply = httpx.request(method, f"{live.url}{path}", headers={"Authorization": f"Bearer {SECRET}"},
                                  json={} if method == "POST" else None)
            assert reply.status_code == 404, (path, reply.status_code)
        assert httpx.get(f"{live.url}/v1/models", headers={"Authorization": f"Bearer {SECRET}"}).status_code == 200
    finally:
        live.stop()


def ws_url(server: LiveServer) -> str:
    return server.url.replace("http://", "ws://") + "/v1/responses"


def a_turn(socket: object) -> dict[str, object]:
    socket.send(json.dumps({"type": "response.create", "model": "scripted-text", "input": "Hi"}))  # type: ignore[attr-defined]
    while True:
        event = json.loads(socket.recv(timeout=60))  # type: ignore[attr-defined]
        if event["type"] in ("response.completed", "response.failed", "error"):
            return event  # type: ignore[no-any-return]


def test_a_browser_offers_its_key_as_a_subprotocol_which_is_never_echoed(server: LiveServer) -> None:
    with connect(ws_url(server), subprotocols=["responses", f"openai-insecure-api-key.{SECRET}"],
                 origin=server.url) as socket:
        assert socket.subprotocol == "responses"
        assert a_turn(socket)["type"] == "response.completed"
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(server), subprotocols=["responses", "openai-insecure-api-key.wrong"], origin=server.url)
    assert refused.value.response.status_code == 401
    validate_error_body(json.loads(refused.value.response.body))
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(server), subprotocols=["responses"], origin=server.url)
    assert refused.value.response.status_code == 401


@pytest.mark.parametrize("origin", ["http://evil.example", "http://127.0.0.1.evil.example", "null",
                                    "http://localhost:1"])
def test_another_sites_page_cannot_open_the_socket(server: LiveServer, origin: str) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(server), subprotocols=["responses", f"openai-insecure-api-key.{SECRET}"], origin=origin)  # type: ignore[arg-type]
    assert refused.value.response.status_code == 403
    body = json.loads(refused.value.response.body)
    validate_error_body(body)
    assert body["error"]["code"] == "origin_not_allowed"
