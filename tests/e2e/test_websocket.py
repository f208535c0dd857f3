"""The WebSocket transport against the real server process (the ``websockets`` client).
Every turn's events are checked by the stream checker, WebSocket rules."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from app.backends.local import LocalBackend
from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.main import create_app
from compliance import check_stream, validate_ws_error
from tests.conftest import SMOL, scripted_backend
from tests.live import LiveServer

TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


class Socket:
    def __init__(self, url: str, key: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else None
        self._stack = contextlib.ExitStack()
        self.ws: ClientConnection = self._stack.enter_context(
            connect(url, additional_headers=headers, open_timeout=10)
        )

    def send(self, **body: Any) -> None:
        self.ws.send(json.dumps({"type": "response.create", **body}))

    def turn(self, timeout: float = 60) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """One turn's messages, ending at the first terminal event or error envelope;
        returns (events, final response or error envelope)."""
        events: list[dict[str, Any]] = []
        while True:
            message = json.loads(self.ws.recv(timeout=timeout))
            if message.get("type") == "error" and "sequence_number" not in message:
                validate_ws_error(message)
                assert not events, "an error envelope after the response started"
                return [], message
            events.append(message)
            if message["type"] in TERMINAL:
                return events, check_stream(events, expect_done=False, transport="websocket")

    def close(self) -> None:
        self._stack.close()


@pytest.fixture(scope="module")
def ws_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, ScriptedBackend]]:
    scripted = scripted_backend()
    local = LocalBackend(model_dir, n_threads=2, preload=[SMOL], models=[SMOL])
    settings = Settings(default_model=SMOL, data_dir=tmp_path_factory.mktemp("ws"))
    server = LiveServer(create_app(settings, backends=[local, scripted])).start()
    yield server, scripted
    server.stop()


@pytest.fixture()
def url(ws_server: tuple[LiveServer, ScriptedBackend]) -> str:
    return ws_server[0].url.replace("http://", "ws://") + "/v1/responses"


@pytest.fixture()
def socket(url: str) -> Iterator[Socket]:
    sock = Socket(url)
    yield sock
    sock.close()


def test_single_turn(socket: Socket) -> None:
    socket.send(model=SMOL, input="Say hello.", max_output_tokens=16)
    events, final = socket.turn()
    assert events[0]["type"] == "response.created"
    assert final["status"] in ("completed", "incomplete") and final["output"]


def test_two_sequential_store_false_turns(socket: Socket) -> None:
    for word in ("one", "two"):
        socket.send(model="scripted-text", input=word, store=False)
        _, final = socket.turn()
        assert final["status"] == "completed" and final["store"] is False


def test_frames_sent_during_a_turn_queue_in_order(socket: Socket, ws_server: tuple[LiveServer, ScriptedBackend]) -> None:
    socket.send(model="scripted-slow", input="first", max_output_tokens=16)
    socket.send(model="scripted-text", input="second")
    socket.send(model="scripted-text", input="third")
    finals = []
    for _ in range(3):
        events, final = socket.turn()
        ids = {e["response"]["id"] for e in events if "response" in e}
        assert len(ids) == 1  # no interleaving of two responses
        finals.append(final)
    scripted = ws_server[1]
    inputs = [r.messages[-1].content for r in scripted.requests[-3:]]
    assert inputs == ["first", "second", "third"]
    assert len({f["id"] for f in finals}) == 3


def test_store_false_continuation_on_one_socket(socket: Socket, ws_server: tuple[LiveServer, ScriptedBackend]) -> None:
    socket.send(model="scripted-text", input="remember PELICAN", store=False)
    _, first = socket.turn()
    socket.send(model="scripted-text", input="what word?", store=False, previous_response_id=first["id"])
    _, second = socket.turn()
    assert second["status"] == "completed" and second["previous_response_id"] == first["id"]
    contents = [m.content for m in ws_server[1].requests[-1].messages]
    assert contents == ["remember PELICAN", "Hello, world.", "what word?"]


def test_store_false_id_from_a_new_socket_is_not_found(url: str) -> None:
    first_socket = Socket(url)
    first_socket.send(model="scripted-text", input="x", store=False)
    _, first = first_socket.turn()
    first_socket.close()
    second_socket = Socket(url)
    second_socket.send(model="scripted-text", input="y", store=False, previous_response_id=first["id"])
    _, error = second_socket.turn()
    assert error["status"] == 400 and error["error"]["code"] == "previous_response_not_found"
    second_socket.send(model="scripted-text", input="full context instead", store=False)
    _, recovered = second_socket.turn()
    assert recovered["status"] == "completed"
    second_socket.close()


def test_stored_id_continues_from_a_new_socket(url: str) -> None:
    first_socket = Socket(url)
    first_socket.send(model="scripted-text", input="x")
    _, first = first_socket.turn()
    first_socket.close()
    second_socket = Socket(url)
    second_socket.send(model="scripted-text", input="y", previous_response_id=first["id"])
    _, second = second_socket.turn()
    assert second["status"] == "completed"
    second_socket.close()


def test_failed_continuation_evicts(socket: Socket) -> None:
    socket.send(model="scripted-text", input="x", store=False)
    _, first = socket.turn()
    socket.send(
        model="scripted-text",
        store=False,
        previous_response_id=first["id"],
        input=[{"type": "function_call_output", "call_id": "call_openresponses_missing", "output": "{}"}],
    )
    _, failed = socket.turn()
    assert failed["type"] == "error" and failed["error"]["code"] == "call_id"
    socket.send(model="scripted-text", input="again", store=False, previous_response_id=first["id"])
    _, evicted = socket.turn()
    assert evicted["error"]["code"] == "previous_response_not_found"


def test_unknown_previous_response(socket: Socket) -> None:
    socket.send(model="scripted-text", input="x", store=False, previous_response_id="resp_unknown")
    _, error = socket.turn()
    assert error["error"]["code"] == "previous_response_not_found"
    assert error["error"]["param"] == "previous_response_id"


@pytest.mark.parametrize(("field", "value"), [("stream", False), ("background", True), ("stream_options", {})])
def test_transport_fields_are_rejected(socket: Socket, field: str, value: Any) -> None:
    socket.send(model="scripted-text", input="x", **{field: value})
    _, error = socket.turn()
    assert error["status"] == 400 and error["error"]["param"] == field
    socket.send(model="scripted-text", input="still usable")
    assert socket.turn()[1]["status"] == "completed"


def test_transport_fields_that_agree_are_accepted(socket: Socket) -> None:
    """Codex sends ``stream: true`` in every frame: what a WebSocket turn does anyway."""
    socket.send(model="scripted-text", input="x", stream=True, background=False, stream_options=None)
    _, final = socket.turn()
    assert final["status"] == "completed" and final["background"] is False


def test_bad_frames_get_errors_and_the_socket_stays_open(socket: Socket) -> None:
    socket.ws.send("not json")
    assert socket.turn()[1]["error"]["code"] == "invalid_json"
    socket.ws.send(json.dumps({"type": "response.cancel"}))
    assert socket.turn()[1]["error"]["param"] == "type"
    socket.send(model="scripted-text", input="fine")
    assert socket.turn()[1]["status"] == "completed"


def test_mid_turn_failure_is_one_response_failed(socket: Socket) -> None:
    socket.send(model="scripted-fail", input="x")
    events, final = socket.turn()
    assert [e["type"] for e in events].count("error") == 0
    assert events[-1]["type"] == "response.failed" and final["error"]["code"] == "upstream_unavailable"


def test_disconnect_mid_turn_stops_generation(url: str, ws_server: tuple[LiveServer, ScriptedBackend]) -> None:
    scripted = ws_server[1]
    before = len(scripted.cancelled)
    sock = Socket(url)
    sock.send(model="scripted-slow", input="x")
    for _ in range(5):
        sock.ws.recv(timeout=60)
    sock.close()
    # scripted-slow runs for 20 s and is counted as cancelled only if it is cut short
    deadline = time.monotonic() + 60
    while len(scripted.cancelled) == before:
        assert time.monotonic() < deadline, "generation went on after the client left"
        time.sleep(0.02)


def test_connection_cap(tmp_path: Path) -> None:
    """A connection ends once it is ``ws_max_connection_seconds`` old: an idle one with the
    error, a busy one's turn with ``response.failed`` after what it streamed until then."""
    settings = Settings(data_dir=tmp_path, ws_max_connection_seconds=3)
    server = LiveServer(create_app(settings, backends=[scripted_backend()])).start()
    try:
        url = server.url.replace("http://", "ws://") + "/v1/responses"
        idle = Socket(url)
        _, error = idle.turn(timeout=60)
        assert error["error"]["code"] == "websocket_connection_limit_reached"
        with pytest.raises(ConnectionClosed) as closed:
            idle.ws.recv(timeout=60)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000

        busy = Socket(url)
        busy.send(model="scripted-slow", input="x")  # 400 deltas, 50 ms apart: longer than the cap
        events, final = busy.turn(timeout=60)
        assert "response.output_text.delta" in [e["type"] for e in events]  # served until the cap
        assert events[-1]["type"] == "response.failed"
        assert final["error"]["code"] == "websocket_connection_limit_reached"
        with pytest.raises(ConnectionClosed):
            busy.ws.recv(timeout=60)
    finally:
        server.stop()


def test_auth_on_the_upgrade(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, api_keys=["secret"])
    server = LiveServer(create_app(settings, backends=[scripted_backend()])).start()
    try:
        url = server.url.replace("http://", "ws://") + "/v1/responses"
        with pytest.raises(InvalidStatus) as refused:
            Socket(url)
        assert refused.value.response.status_code == 401
        assert json.loads(refused.value.response.body)["error"]["code"] == "invalid_api_key"
        allowed = Socket(url, key="secret")
        allowed.send(model="scripted-text", input="x")
        assert allowed.turn()[1]["status"] == "completed"
        allowed.close()
    finally:
        server.stop()


def test_compacted_window_starts_a_new_chain(url: str, ws_server: tuple[LiveServer, ScriptedBackend]) -> None:
    import httpx

    from compliance import check_compact

    server, scripted = ws_server
    conversation = [
        {"role": "user", "content": "My code word is PELICAN."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Thanks."},
    ]
    reply = httpx.post(f"{server.url}/v1/responses/compact", json={"model": "scripted-text", "input": conversation},
                       timeout=30)
    assert reply.status_code == 200, reply.text
    window = check_compact(reply.json())["output"]
    assert [item["type"] for item in window].count("compaction") == 1
    sock = Socket(url)
    sock.send(model="scripted-text", store=False, input=[*window, {"role": "user", "content": "Go on."}])
    _, final = sock.turn()
    sock.close()
    assert final["status"] == "completed"
    seen = [(m.role, m.content) for m in scripted.requests[-1].messages]
    assert seen[0][0] == "system" and seen[0][1].startswith("Summary of the earlier conversation")
    assert "Hello, world." in seen[0][1]  # the scripted model's summary, decrypted
    assert seen[-1] == ("user", "Go on.")


def test_shutdown_ends_the_running_turn_with_response_failed(tmp_path: Path) -> None:
    import threading

    server = LiveServer(create_app(Settings(data_dir=tmp_path), backends=[scripted_backend()])).start()
    sock = Socket(server.url.replace("http://", "ws://") + "/v1/responses")
    sock.send(model="scripted-slow", input="x")
    events: list[dict[str, Any]] = []
    stopper = threading.Thread(target=server.stop)  # once the turn is under way
    try:
        while not events or events[-1]["type"] not in TERMINAL:
            events.append(json.loads(sock.ws.recv(timeout=60)))
            if events[-1]["type"] == "response.output_text.delta" and stopper.ident is None:
                stopper.start()
    finally:
        if stopper.ident is None:
            stopper.start()
        stopper.join()
    final = check_stream(events, expect_done=False, transport="websocket")
    assert events[-1]["type"] == "response.failed"
    assert final["error"]["code"] == "server_shutting_down"
    with pytest.raises(ConnectionClosed):
        sock.ws.recv(timeout=5)
