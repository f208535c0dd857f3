"""The races of a stream: the client goes away, the server shuts down."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import httpx

from app.config import Settings
from app.main import create_app
from compliance import SSEParser, StreamChecker
from tests.conftest import scripted_backend
from tests.live import LiveServer, wait_for


def test_client_disconnect_stops_generation(tmp_path: Path) -> None:
    scripted = scripted_backend()
    with_server = LiveServer(create_app(Settings(data_dir=tmp_path), backends=[scripted])).start()
    try:
        body = {"model": "scripted-slow", "input": "x", "stream": True}
        with httpx.stream("POST", f"{with_server.url}/v1/responses", json=body, timeout=30) as reply:
            deltas = 0
            for line in reply.iter_lines():
                if line.startswith("event: response.output_text.delta"):
                    deltas += 1
                if deltas == 3:
                    break
        assert wait_for(lambda: len(scripted.cancelled) == 1, timeout=60), "generation went on after the client left"
    finally:
        with_server.stop()


def test_non_streaming_disconnect_stops_generation(tmp_path: Path) -> None:
    scripted = scripted_backend()
    with_server = LiveServer(create_app(Settings(data_dir=tmp_path), backends=[scripted])).start()
    try:
        body = json.dumps({"model": "scripted-slow", "input": "x"}).encode()
        head = (f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", with_server.port), timeout=30) as client:
            client.sendall(head + body)
            assert wait_for(lambda: len(scripted.requests) == 1, timeout=60), "the model was never asked"
        # the client has gone away while its answer was being generated
        assert wait_for(lambda: len(scripted.cancelled) == 1, timeout=60), "generation went on after the client left"
    finally:
        with_server.stop()


def test_shutdown_mid_stream_ends_with_a_terminal_event(tmp_path: Path) -> None:
    scripted = scripted_backend()
    server = LiveServer(create_app(Settings(data_dir=tmp_path), backends=[scripted]), graceful_seconds=10).start()
    parser = SSEParser(require_done=True)
    checker = StreamChecker(transport="sse")
    events: list[dict[str, object]] = []
    body = {"model": "scripted-slow", "input": "x", "stream": True}
    stopper = threading.Thread(target=server.stop)  # once the stream is under way
    try:
        with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as reply:
            for chunk in reply.iter_raw():
                for event in parser.feed(chunk):
                    checker.feed(event)
                    events.append(event)
                    if event["type"] == "response.output_text.delta" and stopper.ident is None:
                        stopper.start()
        parser.close()
        final = checker.finish()
    finally:
        if stopper.ident is None:
            stopper.start()
        stopper.join()
    assert final["status"] == "failed"
    assert final["error"]["code"] == "server_shutting_down"
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert json.dumps(final)  # the failed response is complete and serializable
