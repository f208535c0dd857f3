"""Ids in a request are checked once, before any work: an empty or overlong one is a 400
naming it, over HTTP (JSON and SSE) and WebSocket, and the model is never called; and a
client's error is never logged as the server's (no ERROR line, no traceback). Real
server on loopback; the scripted backend (named as such) is recorded to prove no model
call was made."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from compliance import validate_error_body
from tests.conftest import scripted_backend
from tests.live import LiveServer
from tests.recording import RecordingBackend
from tests.ws_client import MuxSocket

LONG = "resp_" + "a" * 600


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, RecordingBackend]]:
    model = RecordingBackend(scripted_backend())
    settings = Settings(data_dir=tmp_path_factory.mktemp("ids"), default_model="scripted-text")
    server = LiveServer(create_app(settings, backends=[model])).start()
    yield server, model
    server.stop()


def refused(reply: httpx.Response, param: str) -> None:
    assert reply.status_code == 400, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    validate_error_body(reply.json())
    assert reply.json()["error"]["param"] == param, reply.json()


BODIES = [
    ({"previous_response_id": ""}, "previous_response_id"),
    ({"previous_response_id": LONG}, "previous_response_id"),
    ({"previous_response_id": 7}, "previous_response_id"),
    ({"conversation": ""}, "conversation"),
    ({"conversation": {"id": ""}}, "conversation"),
    ({"input": [{"type": "message", "role": "user", "content": "Hi", "id": ""}]}, "input[0].id"),
    ({"input": [{"type": "function_call_output", "call_id": "", "output": "x"}]}, "input[0].call_id"),
]


@pytest.mark.parametrize(("body", "param"), BODIES)
@pytest.mark.parametrize("stream", [False, True])
def test_a_bad_id_in_a_body_is_a_400_before_the_model_is_called(
    served: tuple[LiveServer, RecordingBackend], caplog: pytest.LogCaptureFixture, body: dict[str, Any], param: str,
    stream: bool,
) -> None:
    server, model = served
    calls = len(model.requests)
    with caplog.at_level(logging.DEBUG):
        reply = httpx.post(f"{server.url}/v1/responses", json={"input": "Hi", **body, "stream": stream}, timeout=60)
        counted = httpx.post(f"{server.url}/v1/responses/input_tokens", json={"input": "Hi", **body}, timeout=60)
    refused(reply, param if param != "input[0].call_id" else reply.json()["error"]["param"])
    assert reply.json()["error"]["param"].startswith(param.split(".")[0])
    assert counted.status_code == 400
    assert len(model.requests) == calls
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text


def test_a_bad_id_over_the_websocket_is_an_error_envelope_and_the_socket_stays(
        served: tuple[LiveServer, RecordingBackend]) -> None:
    server, model = served
    calls = len(model.requests)
    socket = MuxSocket(server.url.replace("http://", "ws://") + "/v1/responses")
    try:
        socket.send(input="Hi", previous_response_id="")
        [turn] = socket.turns(1)
        assert turn.final["type"] == "error" and turn.final["error"]["param"] == "previous_response_id"
        socket.send(input="Hi")
        [turn] = socket.turns(1)
        assert turn.final["status"] == "completed"
    finally:
        socket.close()
    assert len(model.requests) == calls + 1


@pytest.mark.parametrize(("path", "param"), [
    (f"/v1/responses/{LONG}", "response_id"),
    (f"/v1/responses/{LONG}/input_items", "response_id"),
    ("/v1/responses?after=", "after"),
    ("/v1/responses/resp_x/input_items?after=", "after"),
    (f"/v1/conversations/{LONG}", "conversation_id"),
    (f"/v1/conversations/conv_x/items/{LONG}", "item_id"),
    ("/v1/conversations/conv_x/items?after=", "after"),
])
def test_a_bad_id_in_a_path_or_cursor_is_a_400_naming_it(served: tuple[LiveServer, RecordingBackend], path: str,
                                                         param: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        refused(httpx.get(f"{served[0].url}{path}", timeout=60), param)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
