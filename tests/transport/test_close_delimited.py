"""HTTP/1.0 clients get a stream unframed, ended by the server closing the connection
(uvicorn's h11 implementation, ``app.serve``); HTTP/1.1 clients keep chunked streams and
kept-alive connections. Through the real server (``ors serve`` in front of the benchmark's stub
upstream), on raw sockets, so that the bytes on the wire are what is checked."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from bench.stub import MODEL
from compliance.stream import check_sse_body
from tests.live import ServerProcess

TIMEOUT = 10


@pytest.fixture(scope="module")
def server(fronted_process: ServerProcess) -> ServerProcess:
    return fronted_process


def _request(server: ServerProcess, method: str, path: str, version: str, body: dict[str, Any] | None = None,
             headers: str = "") -> bytes:
    payload = b"" if body is None else json.dumps(body).encode()
    framing = f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n" if body is not None else ""
    return (f"{method} {path} HTTP/{version}\r\nHost: 127.0.0.1:{server.port}\r\n{framing}{headers}\r\n"
            ).encode() + payload


def _until_closed(server: ServerProcess, request: bytes) -> bytes:
    """Everything the server sends, read until it closes the connection (a socket timeout
    fails the test: a body delimited by close must be followed by the close)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sock:
        sock.sendall(request)
        received = bytearray()
        while chunk := sock.recv(1 << 16):
            received += chunk
        return bytes(received)


def _split(answer: bytes) -> tuple[list[tuple[str, str]], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    assert status == "HTTP/1.1 200 OK", status
    return [(name.strip().lower(), value.strip()) for name, value in (line.split(":", 1) for line in lines)], body


def _values(headers: list[tuple[str, str]], name: str) -> list[str]:
    return [value for key, value in headers if key == name]


@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("keep_alive_asked", [False, True])
def test_an_http_1_0_stream_is_sent_unframed_and_ended_by_closing_the_connection(
    server: ServerProcess, store: bool, keep_alive_asked: bool
) -> None:
    request = _request(server, "POST", "/v1/responses", "1.0",
                       {"model": MODEL, "input": "Hi", "store": store, "stream": True},
                       "Connection: keep-alive\r\n" if keep_alive_asked else "")
    headers, body = _split(_until_closed(server, request))
    assert _values(headers, "transfer-encoding") == []
    assert _values(headers, "content-length") == []
    assert _values(headers, "connection") == ["close"]
    assert _values(headers, "content-type") == ["text/event-stream; charset=utf-8"]
    final = check_sse_body(body)  # framing, [DONE], every event against the spec
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "Hello, world."


def test_an_http_1_0_replay_of_a_stored_stream_is_unframed_too(server: ServerProcess) -> None:
    created = _until_closed(server, _request(server, "POST", "/v1/responses", "1.0",
                                             {"model": MODEL, "input": "Hi", "stream": True}))
    response_id = check_sse_body(_split(created)[1])["id"]
    headers, body = _split(_until_closed(server, _request(server, "GET", f"/v1/responses/{response_id}?stream=true",
                                                          "1.0")))
    assert _values(headers, "transfer-encoding") == []
    assert _values(headers, "connection") == ["close"]
    assert check_sse_body(body)["id"] == response_id


def test_an_http_1_0_json_answer_keeps_its_length(server: ServerProcess) -> None:
    headers, body = _split(_until_closed(server, _request(server, "POST", "/v1/responses", "1.0",
                                                          {"model": MODEL, "input": "Hi"})))
    assert _values(headers, "transfer-encoding") == []
    assert _values(headers, "content-length") == [str(len(body))]
    assert json.loads(body)["status"] == "completed"


def test_an_http_1_1_stream_stays_chunked_on_a_kept_alive_connection(server: ServerProcess) -> None:
    request = _request(server, "POST", "/v1/responses", "1.1", {"model": MODEL, "input": "Hi", "stream": True})
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sock:
        for _ in range(2):  # the same connection serves the next request
            sock.sendall(request)
            received = bytearray()
            while not received.endswith(b"\r\n0\r\n\r\n"):
                chunk = sock.recv(1 << 16)
                assert chunk, "the server closed a kept-alive connection"
                received += chunk
            headers, body = _split(bytes(received))
            assert _values(headers, "transfer-encoding") == ["chunked"]
            assert _values(headers, "connection") == []  # kept alive: HTTP/1.1's default, not said
            assert check_sse_body(_unchunk(body))["status"] == "completed"


def _unchunk(body: bytes) -> bytes:
    out, rest = bytearray(), body
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(out)
        out += rest[:size]
        rest = rest[size + 2:]
