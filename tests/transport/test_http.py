"""``POST /v1/responses`` answered as JSON (``app.transport.create``) through the real server:
a client that leaves before the answer stops the generation, the request ends without an
error, and the server goes on serving."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.backends.base import TextDelta
from app.backends.scripted import Script, ScriptedBackend
from app.config import Settings
from app.main import create_app
from compliance import validate_response
from tests.live import LiveServer


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[LiveServer, ScriptedBackend]]:
    """A server with a scripted model (named as such) that waits 30 s before its only
    delta, and one that answers at once."""
    scripted = ScriptedBackend({
        "scripted-silent": Script([TextDelta("late")], delay=30),
        "scripted-quick": Script([TextDelta("quick")]),
    })
    server = LiveServer(create_app(Settings(data_dir=tmp_path), backends=[scripted])).start()
    try:
        yield server, scripted
    finally:
        server.stop()


@pytest.mark.parametrize("store", [True, False])
def test_a_json_client_that_leaves_stops_generation(served: tuple[LiveServer, ScriptedBackend], store: bool,
                                                    problems: list[logging.LogRecord]) -> None:
    server, scripted = served
    body = json.dumps({"model": "scripted-silent", "input": "x", "store": store}).encode()
    head = (f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as client:
        client.sendall(head + body)
        deadline = time.monotonic() + 60  # a bound, not a measurement
        while not scripted.requests and time.monotonic() < deadline:
            time.sleep(0.02)
        assert scripted.requests, "the model was never asked"
    # the client gave up and closed its connection; the model would answer only after 30 s
    deadline = time.monotonic() + 60
    while not scripted.cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(scripted.cancelled) == 1, "generation went on after the client left"
    # a client leaving is not the server's error: no traceback ("Exception in ASGI application")
    time.sleep(0.2)
    assert [record.getMessage() for record in problems] == []
    # the task that served it was cancelled, not the server: the next request is answered
    reply = httpx.post(f"{server.url}/v1/responses", json={"model": "scripted-quick", "input": "x"}, timeout=30)
    assert reply.status_code == 200
    validate_response(reply.json())
    assert reply.json()["output"][0]["content"][0]["text"] == "quick"
