"""The body's receipt deadline against the real server on 127.0.0.1 (raw sockets: the
slow clients are the point): a request whose body stops coming for
``ORS_REQUEST_READ_TIMEOUT`` is answered 408 and its connection closed; a slow body that
keeps coming, a WebSocket and kept-alive connections are not. (Headers sent slowly are
the reverse proxy's to bound: the app never sees them.)"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from app.backends.scripted import ScriptedBackend, text_script
from app.config import Settings
from app.main import create_app
from compliance import check_response
from tests.live import LiveServer

TIMEOUT = 0.5
BODY = b'{"model": "scripted-text", "input": "x"}'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("receipt"), request_read_timeout=TIMEOUT)
    app = create_app(settings, backends=[ScriptedBackend({"scripted-text": text_script("Hello", ".")})])
    server = LiveServer(app).start()
    yield server
    server.stop()


def _open(server: LiveServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _request(length: int) -> bytes:
    return (b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % length)


def _error_and_close(sock: socket.socket) -> tuple[bytes, dict[str, object]]:
    """The answer's head and error object, read until the server closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return head, json.loads(body)


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_body_that_stops_coming_is_answered_408_and_the_connection_closed(
        server: LiveServer, caplog: pytest.LogCaptureFixture, framing: str) -> None:
    caplog.set_level("INFO")
    with _open(server) as sock:
        if framing == "length":
            sock.sendall(_request(len(BODY)) + BODY[:10])
        else:
            sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\na\r\n" + BODY[:10] + b"\r\n")
        head, error = _error_and_close(sock)  # a socket timeout (10 s) fails the test
    assert head.startswith(b"HTTP/1.1 408"), head
    assert b"connection: close" in head.lower()
    assert error == {"error": {"type": "invalid_request", "code": "request_timeout", "param": None,
                               "message": "The request's body stopped coming for more than 0.5 seconds "
                                          "(ORS_REQUEST_READ_TIMEOUT)."}}
    assert "a request's body went silent for more than 0.5s" in caplog.text
    # a slow client, not a failure of the server
    assert not [record for record in caplog.records if record.levelname == "ERROR"], caplog.text


def test_a_slow_body_that_keeps_coming_is_served(server: LiveServer) -> None:
    with _open(server) as sock:
        sock.sendall(_request(len(BODY)))
        for start in range(0, len(BODY), 8):  # 2.5 timeouts in all, never one of silence
            time.sleep(TIMEOUT / 2)
            sock.sendall(BODY[start:start + 8])
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


def test_kept_alive_connections_and_a_websocket_outlive_the_deadline(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url) as client:
        for _ in range(2):
            reply = client.post("/v1/responses", content=BODY, headers={"Content-Type": "application/json"})
            assert check_response(reply.json())["status"] == "completed"
            time.sleep(TIMEOUT * 1.5)  # idle between requests: uvicorn's keep-alive (5 s) rules
    with connect(server.url.replace("http://", "ws://") + "/v1/responses", open_timeout=10) as ws:
        time.sleep(TIMEOUT * 3)
        ws.send(json.dumps({"type": "response.create", "model": "scripted-text", "input": "x", "store": False}))
        while (event := json.loads(ws.recv(timeout=10)))["type"] != "response.completed":
            assert event["type"] != "error", event


def test_a_timeout_of_zero_turns_it_off(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path, request_read_timeout=0),
                     backends=[ScriptedBackend({"scripted-text": text_script("Hello", ".")})])
    server = LiveServer(app).start()
    try:
        with _open(server) as sock:
            sock.sendall(_request(len(BODY)) + BODY[:10])
            sock.settimeout(TIMEOUT * 3)
            with pytest.raises(TimeoutError):
                sock.recv(1)
            sock.sendall(BODY[10:])  # the rest, late: served
            sock.settimeout(10)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        server.stop()
