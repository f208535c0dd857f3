"""Streams (``app.transport.sse``, sse-starlette's response) through the real server: the
bytes and headers on the wire, pings in silence, a client that leaves while nothing is
being sent, a client that reads nothing, and a drain that leaves the next server of the
same process alone."""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.backends.base import TextDelta
from app.backends.scripted import Script, ScriptedBackend, text_script
from app.config import Settings
from app.main import create_app
from compliance import SSEParser, StreamChecker
from tests.live import LiveServer, wait_for

BLOCK = re.compile(rb"event: ([a-z_.]+)\ndata: (\{[^\n]*\})\n\n")
PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"


def _scripted() -> ScriptedBackend:
    """Scripted models (named as such): one answers at once, one pauses 0.5 s before
    each of two deltas, one waits 30 s before its only delta, one writes about 80 MB in
    deltas of 4 KiB, a millisecond apart."""
    return ScriptedBackend({
        "scripted-text": text_script("Hello", ", ", "world", "."),
        "scripted-pauses": Script([TextDelta("slow"), TextDelta(" answer")], delay=0.5),
        "scripted-silent": Script([TextDelta("late")], delay=30),
        "scripted-flood": Script([TextDelta("x" * 4096)] * 20_000, delay=0.001),
    })


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., tuple[LiveServer, ScriptedBackend]]]:
    """Starts servers on settings of the test's choosing; stops them all at the end."""
    started: list[LiveServer] = []

    def start(**settings: Any) -> tuple[LiveServer, ScriptedBackend]:
        scripted = _scripted()
        app = create_app(Settings(data_dir=tmp_path / f"server-{len(started)}", **settings), backends=[scripted])
        started.append(LiveServer(app).start())
        return started[-1], scripted

    try:
        yield start
    finally:
        for server in started:
            if server.thread.is_alive():  # not stopped by the test itself
                server.stop()




def _stored_when_over(server: LiveServer, response_id: str) -> dict[str, Any]:
    stored: dict[str, Any] = {}

    def over() -> bool:
        nonlocal stored
        stored = httpx.get(f"{server.url}/v1/responses/{response_id}").json()
        return stored["status"] != "in_progress"

    assert wait_for(over), stored
    return stored


def test_the_bytes_on_the_wire_are_event_and_data_lines_then_done(serve: Callable[..., Any]) -> None:
    server, _ = serve()
    body = {"model": "scripted-text", "input": "x", "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=30) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert reply.headers["cache-control"] == "no-store"
        assert reply.headers["x-accel-buffering"] == "no"
        assert "connection" not in reply.headers  # kept alive: HTTP/1.1's default, not said
        raw = b"".join(reply.iter_raw())
    assert raw.endswith(DONE)
    blocks = raw[: -len(DONE)]
    events = [(match[1].decode(), json.loads(match[2])) for match in BLOCK.finditer(blocks)]
    # nothing but whole blocks, one after the other: no id lines, no \r, no other fields
    assert b"".join(match[0] for match in BLOCK.finditer(blocks)) == blocks
    assert [kind for kind, data in events] == [data["type"] for kind, data in events]
    assert events[0][0] == "response.created"
    assert events[-1][0] == "response.completed"
    assert events[-1][1]["response"]["output"][0]["content"][0]["text"] == "Hello, world."


def test_a_silent_stream_is_kept_alive_with_pings_between_whole_blocks(serve: Callable[..., Any]) -> None:
    server, _ = serve(sse_ping_seconds=0.1)
    parser = SSEParser(require_done=True, block_aligned_chunks=True)
    checker = StreamChecker(transport="sse")
    raw = b""
    body = {"model": "scripted-pauses", "input": "x", "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=30) as reply:
        for chunk in reply.iter_raw():
            raw += chunk
            for event in parser.feed(chunk):
                checker.feed(event)
    parser.close()
    final = checker.finish()
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "slow answer"
    # about a second of silence, a ping every 0.1 s; each one a comment block of its own
    assert raw.count(PING) >= 3
    assert raw.replace(PING, b"").endswith(DONE)


def test_no_pings_when_they_are_off(serve: Callable[..., Any]) -> None:
    server, _ = serve(sse_ping_seconds=0)
    body = {"model": "scripted-pauses", "input": "x", "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=30) as reply:
        raw = b"".join(reply.iter_raw())
    assert PING not in raw
    assert raw.endswith(DONE)


def test_a_client_that_leaves_while_nothing_is_sent_stops_generation(
        serve: Callable[..., Any], problems: list[logging.LogRecord]) -> None:
    server, scripted = serve()
    body = {"model": "scripted-silent", "input": "x", "stream": True}
    parser = SSEParser(require_done=False)
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=30) as reply:
        seen: list[str] = []
        for chunk in reply.iter_raw():
            seen += [event["type"] for event in parser.feed(chunk)]
            if "response.in_progress" in seen:
                break  # the model is now silent for 30 s; the client leaves
    assert wait_for(lambda: len(scripted.cancelled) == 1), "generation went on after the client left"
    # the response was closed as the client leaving closes one, and recorded
    stored = _stored_when_over(server, parser.events[0]["response"]["id"])
    assert stored["status"] == "incomplete"
    assert stored["incomplete_details"] == {"reason": "client_disconnected"}
    assert [record.getMessage() for record in problems] == []  # a client leaving is not an error


def test_a_client_that_reads_nothing_is_let_go_after_the_send_timeout(
        serve: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    server, scripted = serve(sse_send_timeout=0.5)
    payload = json.dumps({"model": "scripted-flood", "input": "x", "stream": True}).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, never read
        sock.settimeout(10)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
        head = sock.recv(256)
        assert head.startswith(b"HTTP/1.1 200"), head
        # the client reads no more: once the buffers are full, a send waits, and times out
        assert wait_for(lambda: len(scripted.cancelled) == 1), "generation went on for a client that reads nothing"
        response_id = re.search(rb'"id":"(resp_[^"]+)"', head + sock.recv(4096))
        assert wait_for(lambda: "read nothing for 0.5s" in caplog.text), "the stream's end was not logged"
    assert response_id is not None
    stored = _stored_when_over(server, response_id[1].decode())
    assert stored["status"] == "incomplete"
    assert stored["incomplete_details"] == {"reason": "client_disconnected"}


def test_a_drain_ends_its_streams_and_leaves_the_next_server_of_the_process_alone(
        serve: Callable[..., Any]) -> None:
    for _ in range(2):  # the second server starts after the first one was stopped
        server, _ = serve()
        parser = SSEParser(require_done=True)
        checker = StreamChecker(transport="sse")
        body = {"model": "scripted-silent", "input": "x", "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=30) as reply:
            for chunk in reply.iter_raw():
                for event in parser.feed(chunk):
                    checker.feed(event)
                    if event["type"] == "response.in_progress":
                        server.stop()  # here: the stream is drained meanwhile, then read
        parser.close()
        final = checker.finish()
        assert final["status"] == "failed"
        assert final["error"]["code"] == "server_shutting_down"
    # a stream of a server started later in the same process runs to its end (a second
    # and more), not cut by the shutdowns seen before
    follower, _ = serve()
    parser = SSEParser(require_done=True)
    checker = StreamChecker(transport="sse")
    with httpx.stream("POST", f"{follower.url}/v1/responses", timeout=30,
                      json={"model": "scripted-pauses", "input": "x", "stream": True}) as reply:
        for chunk in reply.iter_raw():
            for event in parser.feed(chunk):
                checker.feed(event)
    parser.close()
    assert checker.finish()["status"] == "completed"
