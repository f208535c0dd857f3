"""The SSE response (``app.transport.sse.EventStream``) through the real server: pings in
silence, a client that leaves while nothing is being sent, every block whole."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.backends.base import TextDelta
from app.backends.scripted import Script, ScriptedBackend
from app.config import Settings
from app.main import create_app
from app.transport import sse
from compliance import SSEParser, StreamChecker
from tests.live import LiveServer


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[LiveServer, ScriptedBackend]]:
    """A server whose scripted models (named as such) are silent for a while: one pauses
    0.5 s before each of two deltas, one waits 30 s before its only delta."""
    scripted = ScriptedBackend({
        "scripted-pauses": Script([TextDelta("slow"), TextDelta(" answer")], delay=0.5),
        "scripted-silent": Script([TextDelta("late")], delay=30),
    })
    server = LiveServer(create_app(Settings(data_dir=tmp_path), backends=[scripted])).start()
    try:
        yield server, scripted
    finally:
        server.stop()


def test_a_silent_stream_is_kept_alive_with_pings_between_whole_blocks(
        served: tuple[LiveServer, ScriptedBackend], monkeypatch: pytest.MonkeyPatch) -> None:
    server, _ = served
    monkeypatch.setattr(sse, "PING_SECONDS", 0.1)
    parser = SSEParser(require_done=True, block_aligned_chunks=True)
    checker = StreamChecker(transport="sse")
    raw = b""
    body = {"model": "scripted-pauses", "input": "x", "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=30) as reply:
        assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert reply.headers["cache-control"] == "no-store"
        for chunk in reply.iter_raw():
            raw += chunk
            for event in parser.feed(chunk):
                checker.feed(event)
    parser.close()
    final = checker.finish()
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "slow answer"
    # about a second of silence, a ping every 0.1 s; each one a comment block of its own
    assert raw.count(b": ping\n\n") >= 3
    assert raw.endswith(b"data: [DONE]\n\n")


def test_a_client_that_leaves_while_nothing_is_sent_stops_generation(
        served: tuple[LiveServer, ScriptedBackend], problems: list[logging.LogRecord]) -> None:
    server, scripted = served
    body = {"model": "scripted-silent", "input": "x", "stream": True}
    parser = SSEParser(require_done=False)
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=30) as reply:
        seen: list[str] = []
        for chunk in reply.iter_raw():
            seen += [event["type"] for event in parser.feed(chunk)]
            if "response.in_progress" in seen:
                break  # the model is now silent for 30 s; the client leaves
    deadline = time.monotonic() + 10
    while not scripted.cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(scripted.cancelled) == 1, "generation went on after the client left"
    # the response was closed as the client leaving closes one, and recorded
    response_id = parser.events[0]["response"]["id"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stored = httpx.get(f"{server.url}/v1/responses/{response_id}").json()
        if stored["status"] != "in_progress":
            break
        time.sleep(0.02)
    assert stored["status"] == "incomplete"
    assert stored["incomplete_details"] == {"reason": "client_disconnected"}
    assert [record.getMessage() for record in problems] == []  # a client leaving is not an error


def test_a_stream_has_the_headers_starlette_would_give_it() -> None:
    from starlette.responses import StreamingResponse

    from app.transport.sse import HEADERS, EventStream

    async def body():  # type: ignore[no-untyped-def]
        yield b""

    made_once = EventStream(body()).raw_headers
    assert made_once == StreamingResponse(body(), headers=HEADERS, media_type="text/event-stream").raw_headers
    assert made_once is not EventStream(body()).raw_headers  # each response's own list
