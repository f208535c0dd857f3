"""When a stored response is recorded, by how it is delivered, through the real server.

A JSON answer is recorded once, whole, at its end, with no events; a stream (SSE,
WebSocket) records its start before its first event, so the response can be fetched
while it streams, and its end with its events before its terminal event; a background
response is recorded as a stream is, by a task of its own; a response cut short (the
client gone, a cancel) ends recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from app.config import Settings
from app.main import create_app
from compliance import SSEParser, check_stream
from tests.conftest import scripted_backend
from tests.engine.conftest import counted_writes
from tests.live import LiveServer, wait_for

TERMINAL = ("response.completed", "response.failed", "response.incomplete")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(create_app(Settings(data_dir=tmp_path), backends=[scripted_backend()])).start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
def writes(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The store's writes, in order (begin, finish, record), as the server makes them."""
    return counted_writes(server.server.config.app.state.engine.store, monkeypatch)




def _get(server: LiveServer, response_id: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{server.url}/v1/responses/{response_id}", params=params, timeout=30)


def _sse(raw: bytes) -> list[dict[str, Any]]:
    parser = SSEParser(require_done=True)
    events = parser.feed(raw)
    parser.close()
    return events


def test_a_json_answer_is_recorded_once_whole_without_events(server: LiveServer, writes: list[str]) -> None:
    reply = httpx.post(f"{server.url}/v1/responses", json={"model": "scripted-text", "input": "hi"}, timeout=30)
    assert reply.status_code == 200
    answer = reply.json()
    assert writes == ["record"]  # one write, at the end: no start before it
    stored = _get(server, answer["id"])
    assert stored.status_code == 200 and stored.text == reply.text  # the answer is the record, byte for byte
    replay = _get(server, answer["id"], stream="true")
    assert replay.status_code == 400 and replay.json()["error"]["code"] == "events_unavailable"


def test_an_unstored_json_answer_writes_nothing(server: LiveServer, writes: list[str]) -> None:
    reply = httpx.post(f"{server.url}/v1/responses", json={"model": "scripted-text", "input": "hi", "store": False},
                       timeout=30)
    assert reply.status_code == 200 and reply.json()["status"] == "completed"
    assert writes == []
    assert _get(server, reply.json()["id"]).status_code == 404


def test_a_stream_is_readable_while_it_streams_and_its_events_are_recorded_with_its_end(
    server: LiveServer, writes: list[str]
) -> None:
    body = {"model": "scripted-slow", "input": "x", "stream": True}
    raw = b""
    seen_while_streaming: dict[str, Any] = {}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as reply:
        parser = SSEParser(require_done=True)
        for chunk in reply.iter_raw():
            raw += chunk
            events = parser.feed(chunk)
            if not seen_while_streaming and any(event["type"] == "response.output_text.delta" for event in events):
                response_id = json.loads(raw.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]["id"]
                assert writes == ["begin"]  # the start, before the first event; nothing per delta
                seen_while_streaming = _get(server, response_id).json()
            # the scripted model runs 20 s: the client stops it once it has seen the start
            if seen_while_streaming:
                break
    assert seen_while_streaming["status"] == "in_progress" and seen_while_streaming["output"] == []
    response_id = seen_while_streaming["id"]
    # the client left: the response ends incomplete, and that end is recorded
    assert wait_for(lambda: _get(server, response_id).json()["status"] != "in_progress")
    stored = _get(server, response_id).json()
    assert stored["status"] == "incomplete"
    assert stored["incomplete_details"] == {"reason": "client_disconnected"}
    assert writes == ["begin", "finish"]
    replayed = _sse(_get(server, response_id, stream="true").content)
    assert check_stream(replayed, expect_done=False)["status"] == "incomplete"


def test_a_finished_stream_replays_exactly_what_was_sent(server: LiveServer, writes: list[str]) -> None:
    body = {"model": "scripted-reasoning", "input": "x", "stream": True}
    sent = httpx.post(f"{server.url}/v1/responses", json=body, timeout=30)
    events = _sse(sent.content)
    assert writes == ["begin", "finish"]
    response_id = events[0]["response"]["id"]
    replay = _get(server, response_id, stream="true")
    assert replay.content == sent.content  # byte for byte, [DONE] included
    assert _get(server, response_id).json() == events[-1]["response"]


def test_a_websocket_turn_is_recorded_as_a_stream(server: LiveServer, writes: list[str]) -> None:
    with connect(server.url.replace("http://", "ws://") + "/v1/responses", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "scripted-text", "input": "hi"}))
        frames: list[str] = []
        while not frames or json.loads(frames[-1])["type"] not in TERMINAL:
            frames.append(str(ws.recv(timeout=30)))
    final = check_stream([json.loads(frame) for frame in frames], expect_done=False, transport="websocket")
    assert writes == ["begin", "finish"]
    replay = _sse(_get(server, final["id"], stream="true").content)
    assert [json.dumps(event, separators=(",", ":"), ensure_ascii=False) for event in replay] == frames


def test_a_background_response_is_recorded_from_its_start_and_ends_recorded_when_cancelled(
    server: LiveServer, writes: list[str]
) -> None:
    body = {"model": "scripted-slow", "input": "x", "background": True}
    created = httpx.post(f"{server.url}/v1/responses", json=body, timeout=30).json()
    assert created["status"] in ("queued", "in_progress")
    assert writes[0] == "begin"  # recorded before the answer that gives out its id
    assert _get(server, created["id"]).json()["status"] in ("queued", "in_progress")
    cancelled = httpx.post(f"{server.url}/v1/responses/{created['id']}/cancel", timeout=30).json()
    assert cancelled["status"] == "cancelled"
    assert _get(server, created["id"]).json() == cancelled
    assert writes[-1] == "finish"
    replay = _sse(_get(server, created["id"], stream="true").content)
    assert check_stream(replay, expect_done=False)["status"] == "cancelled"
