"""The receipt deadline against the real server on 127.0.0.1 (raw sockets: the slow
clients are the point): a connection that sends nothing, half its headers, or stops in
its body is closed after ``ORS_REQUEST_READ_TIMEOUT``; a slow body that keeps coming, a
WebSocket and kept-alive connections are not."""

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


def _closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes ``sock`` (reads to the end, whatever comes)."""
    started = time.monotonic()
    while sock.recv(65536):
        pass
    return time.monotonic() - started


def _request(length: int) -> bytes:
    return (b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % length)


def test_a_connection_that_sends_nothing_is_closed(server: LiveServer) -> None:
    with _open(server) as sock:
        assert TIMEOUT * 0.8 < _closed_after(sock) < TIMEOUT * 6


def test_headers_trickled_a_byte_at_a_time_are_closed_at_the_deadline(server: LiveServer) -> None:
    with _open(server) as sock:
        started = time.monotonic()
        with pytest.raises(OSError):  # noqa: PT012 - the send that meets the closed socket
            for byte in b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000:
                sock.sendall(bytes([byte]))
                time.sleep(TIMEOUT / 10)
                if time.monotonic() - started > TIMEOUT * 10:
                    pytest.fail("the connection is still open")
        assert time.monotonic() - started < TIMEOUT * 6


def test_a_body_that_stops_coming_is_closed(server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    with _open(server) as sock:
        sock.sendall(_request(len(BODY)) + BODY[:10])
        assert TIMEOUT * 0.8 < _closed_after(sock) < TIMEOUT * 6
    time.sleep(0.2)  # the handler sees the client leave
    assert "took more than 0.5s to send its request's body" in caplog.text
    # the client left, as any client may while sending a body: no error, a 499 in the access log
    assert not [record for record in caplog.records if record.levelname == "ERROR"], caplog.text
    assert '"POST /v1/responses HTTP/1.1" 499' in caplog.text


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
            sock.settimeout(TIMEOUT * 3)
            with pytest.raises(TimeoutError):
                sock.recv(1)
    finally:
        server.stop()
