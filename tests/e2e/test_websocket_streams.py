"""WebSocket multiplexing (``stream_id``) against the real server process: several
responses at once on one connection, each event tagged with its stream, streams run
concurrently and each in order, forks across streams, the per-connection limits, and
how a closed socket, the connection cap and shutdown end the responses running.
Every event and envelope is checked (``tests.ws_client``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from app.backends.scripted import Script, ScriptedBackend, text_script
from app.config import Settings
from app.main import create_app
from tests.live import LiveServer, wait_for
from tests.ws_client import MuxSocket, Turn


def scripted() -> ScriptedBackend:
    return ScriptedBackend({
        "scripted-text": text_script("Hello", ", ", "world", "."),
        "scripted-ticks": Script(text_script(*["tick "] * 20), delay=0.05),  # about a second
        "scripted-slow": Script(text_script(*["tick "] * 400), delay=0.05),  # 20 s: ended by the test
    })


def ws_url(server: LiveServer) -> str:
    return server.url.replace("http://", "ws://") + "/v1/responses"


@pytest.fixture(scope="module")
def mux_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, ScriptedBackend]]:
    backend = scripted()
    settings = Settings(data_dir=tmp_path_factory.mktemp("ws-streams"), default_model="scripted-text")
    server = LiveServer(create_app(settings, backends=[backend])).start()
    yield server, backend
    server.stop()


@pytest.fixture()
def sock(mux_server: tuple[LiveServer, ScriptedBackend]) -> Iterator[MuxSocket]:
    socket = MuxSocket(ws_url(mux_server[0]))
    yield socket
    socket.close()


def by_stream(turns: list[Turn]) -> dict[str | None, Turn]:
    return {turn.stream: turn for turn in turns}


def test_every_event_carries_its_stream_id(sock: MuxSocket) -> None:
    sock.send("main", model="scripted-text", input="hi")
    [turn] = sock.turns(1)
    assert turn.stream == "main" and turn.final["status"] == "completed"
    assert all(event["stream_id"] == "main" for event in turn.events)
    sock.send(model="scripted-text", input="no stream")  # frames without one: untagged, as always
    [plain] = sock.turns(1)
    assert plain.stream is None and all("stream_id" not in event for event in plain.events)


def test_streams_run_at_once_each_in_order(sock: MuxSocket, mux_server: tuple[LiveServer, ScriptedBackend]) -> None:
    backend = mux_server[1]
    sock.send("a", model="scripted-ticks", input="first")
    sock.send("a", model="scripted-text", input="second")
    sock.send("b", model="scripted-text", input="third")
    turns = sock.turns(3)
    first, second = [turn for turn in turns if turn.stream == "a"]
    [third] = [turn for turn in turns if turn.stream == "b"]
    assert all(turn.final["status"] == "completed" for turn in turns)
    assert second.first > first.last  # one stream: one after another, in the order sent
    assert first.first < third.first and third.last < first.last  # b ran while a's first turn did
    inputs = [request.messages[-1].content for request in backend.requests[-3:]]
    assert inputs.index("first") < inputs.index("second")


def test_a_response_of_one_stream_forks_onto_another(sock: MuxSocket,
                                                     mux_server: tuple[LiveServer, ScriptedBackend]) -> None:
    backend = mux_server[1]
    sock.send("a", model="scripted-text", input="remember PELICAN", store=False)
    [base] = sock.turns(1)
    sock.send("b", model="scripted-text", input="what word?", store=False, previous_response_id=base.id)
    [fork] = sock.turns(1)
    assert fork.stream == "b" and fork.final["previous_response_id"] == base.id
    assert [m.content for m in backend.requests[-1].messages] == ["remember PELICAN", "Hello, world.", "what word?"]
    # each stream keeps its own latest response: a's is still the base, b's the fork
    sock.send("a", model="scripted-text", input="again", store=False, previous_response_id=base.id)
    sock.send("b", model="scripted-text", input="and on", store=False, previous_response_id=fork.id)
    continued = by_stream(sock.turns(2))
    assert continued["a"].final["status"] == continued["b"].final["status"] == "completed"
    # a fork of a stream's latest response, sent while that stream runs its next turn
    sock.send("a", model="scripted-ticks", input="a goes on", store=False, previous_response_id=continued["a"].id)
    sock.send("c", model="scripted-text", input="fork", store=False, previous_response_id=continued["a"].id)
    forked = by_stream(sock.turns(2))
    assert forked["c"].final["status"] == "completed" and forked["c"].last < forked["a"].last


def test_one_stream_remembers_its_latest_response_only(sock: MuxSocket) -> None:
    """Per stream, what a connection without streams has always done."""
    sock.send("a", model="scripted-text", input="one", store=False)
    [one] = sock.turns(1)
    sock.send("a", model="scripted-text", input="two", store=False, previous_response_id=one.id)
    sock.turns(1)
    sock.send("a", model="scripted-text", input="three", store=False, previous_response_id=one.id)
    [error] = sock.turns(1)
    assert error.failed_early and error.final["error"]["code"] == "previous_response_not_found"
    assert error.final["stream_id"] == "a"


def test_errors_carry_the_stream_id_and_leave_the_stream_usable(sock: MuxSocket) -> None:
    sock.send("a", model="scripted-text", input="x", stream=False)
    sock.send("b", model="scripted-text", input="x", generate="no")
    errors = by_stream(sock.turns(2))
    assert errors["a"].final["status"] == 400 and errors["a"].final["error"]["param"] == "stream"
    assert errors["b"].final["error"]["param"] == "generate"
    sock.send("c", model="scripted-text", input="x", stream_id_is_not_a="field")  # an unknown field: ignored
    sock.send_raw({"type": "response.create", "stream_id": 7, "model": "scripted-text", "input": "x"})
    sock.send_raw({"type": "response.create", "stream_id": "s" * 65, "model": "scripted-text", "input": "x"})
    turns = sock.turns(3)
    assert by_stream(turns)["c"].final["status"] == "completed"
    assert [turn.final["error"]["param"] for turn in turns if turn.stream is None] == ["stream_id", "stream_id"]
    sock.send("a", model="scripted-text", input="fine now")
    assert sock.turns(1)[0].final["status"] == "completed"


def test_steering_is_refused_with_the_input_handed_back(sock: MuxSocket) -> None:
    sock.send("a", model="scripted-ticks", input="long")
    created = sock.until(lambda message: message["type"] == "response.created")
    steer_input = [{"type": "message", "role": "user", "content": "focus on tests"}]
    sock.send_raw({"type": "response.steer", "previous_response_id": created["response"]["id"], "input": steer_input})
    sock.until(lambda message: message["type"] == "response.steer.failed")
    [failed] = sock.steer_failures
    assert failed["error"]["code"] == "steering_not_supported" and failed["stream_id"] == "a"
    assert failed["steer"] == {"previous_response_id": created["response"]["id"], "input": steer_input}
    [turn] = sock.turns(1)
    assert turn.final["status"] == "completed"  # the response was left alone


def test_a_closed_socket_cancels_every_running_response(mux_server: tuple[LiveServer, ScriptedBackend]) -> None:
    server, backend = mux_server
    before = len(backend.cancelled)
    sock = MuxSocket(ws_url(server))
    sock.send("a", model="scripted-slow", input="x")
    sock.send("b", model="scripted-slow", input="y")
    streaming: set[str | None] = set()
    while streaming != {"a", "b"}:
        message = sock.next()
        if message["type"] == "response.output_text.delta":
            streaming.add(message["stream_id"])
    sock.close()
    # each runs for 20 s and is counted as cancelled only if it is cut short
    assert wait_for(lambda: len(backend.cancelled) - before == 2, timeout=60), "generation went on"


def test_the_limits_of_a_connection(tmp_path: Path) -> None:
    backend = scripted()
    settings = Settings(data_dir=tmp_path, ws_max_streams=2, ws_max_queued_frames=1)
    server = LiveServer(create_app(settings, backends=[backend])).start()
    try:
        sock = MuxSocket(ws_url(server))
        sock.send("a", model="scripted-slow", input="x")
        sock.send("b", model="scripted-slow", input="y")
        sock.send("c", model="scripted-text", input="z")  # a third stream
        [refused] = sock.turns(1)
        assert refused.final["status"] == 429 and refused.final["stream_id"] == "c"
        assert refused.final["error"]["code"] == "too_many_streams" and refused.final["error"]["param"] == "stream_id"
        sock.send("a", model="scripted-text", input="waits")  # one may wait behind a's running turn
        sock.send("a", model="scripted-text", input="one too many")
        [full] = sock.turns(1)
        assert full.final["error"]["code"] == "too_many_queued_frames" and full.final["stream_id"] == "a"
        sock.close()
    finally:
        server.stop()


@pytest.mark.parametrize("ending", ["cap", "shutdown"])
def test_each_running_response_ends_with_its_terminal_event(tmp_path: Path, ending: str) -> None:
    settings = Settings(data_dir=tmp_path, ws_max_connection_seconds=3 if ending == "cap" else 3600)
    server = LiveServer(create_app(settings, backends=[scripted()])).start()
    stopper = threading.Thread(target=server.stop)
    try:
        sock = MuxSocket(ws_url(server))
        sock.send("a", model="scripted-slow", input="x")
        sock.send("b", model="scripted-slow", input="y")
        sock.send("a", model="scripted-text", input="never runs")
        streaming: set[Any] = set()
        while streaming != {"a", "b"}:
            message = sock.next()
            if message["type"] == "response.output_text.delta":
                streaming.add(message["stream_id"])
        if ending == "shutdown":
            stopper.start()
        turns = by_stream(sock.turns(2))
        code = "websocket_connection_limit_reached" if ending == "cap" else "server_shutting_down"
        for stream in ("a", "b"):
            assert turns[stream].events[-1]["type"] == "response.failed"
            assert turns[stream].final["error"]["code"] == code
        with pytest.raises(ConnectionClosed):
            sock.next(timeout=60)  # nothing more: the queued turn was dropped, the socket closed
        assert len(sock.finished) == 2
    finally:
        if stopper.ident is None:
            stopper.start()
        stopper.join()


def test_codex_connects_as_codex_does(mux_server: tuple[LiveServer, ScriptedBackend]) -> None:
    """Codex's handshake headers and frames: a warm-up, then a turn with only the new
    input, ``stream: true`` in each, and ``response.processed`` after a response."""
    server, backend = mux_server
    headers = {"OpenAI-Beta": "responses_websockets=2026-02-06", "originator": "codex_cli_rs",
               "session-id": "019a0000-0000-7000-8000-000000000000", "version": "0.171.0"}
    codex = MuxSocket(ws_url(server), headers=headers)  # permessage-deflate, as Codex asks
    try:
        assert codex.ws.protocol.extensions, "permessage-deflate was not negotiated"
        request = {"model": "scripted-text", "instructions": "You are Codex.", "tools": [], "tool_choice": "auto",
                   "parallel_tool_calls": False, "reasoning": None, "store": False, "stream": True, "include": [],
                   "prompt_cache_key": "thread-1"}
        opening = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]}]
        codex.send(**request, input=opening, generate=False)
        [warm] = codex.turns(1)
        assert warm.final["status"] == "completed" and warm.final["output"] == []
        codex.send(**request, input=[], previous_response_id=warm.id)
        [turn] = codex.turns(1)
        assert turn.final["status"] == "completed"
        assert [m.content for m in backend.requests[-1].messages] == ["You are Codex.", "list files"]
        codex.send_raw({"type": "response.processed", "response_id": turn.id})
        codex.send(**request, input=[], previous_response_id=turn.id)
        assert codex.next()["type"] == "response.created"  # response.processed was answered with nothing
        codex.turns(1)
    finally:
        codex.close()
