"""Rate limits against the real server on 127.0.0.1 (scripted models, no weights): the 429
as the spec's error object with ``Retry-After``, places held while a response runs and
given back however it ends, the WebSocket's error envelope, and two servers sharing one
Redis budget."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from app.backends.base import Delta, GenerationRequest
from app.backends.scripted import ScriptedBackend, text_script
from app.config import Settings
from app.main import create_app
from compliance import validate_error_body, validate_ws_error
from tests.client import Client
from tests.conftest import scripted_backend
from tests.live import LiveServer, wait_for

QUICK = {"model": "scripted-text", "input": "hi"}
GATED = {"model": "scripted-gated", "input": "hi"}


@dataclass
class Served:
    server: LiveServer
    gate: threading.Event

    @property
    def url(self) -> str:
        return self.server.url


def gated_backend(gate: threading.Event) -> ScriptedBackend:
    """The scripted models plus ``scripted-gated``, which answers once ``gate`` is set."""
    backend = scripted_backend()

    async def gated(request: GenerationRequest) -> list[Delta]:
        await asyncio.to_thread(gate.wait, 120)
        return text_script("Let", " through.")

    backend.scripts.update(ScriptedBackend({"scripted-gated": gated}).scripts)
    return backend


@pytest.fixture()
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(**settings: Any) -> Served:
        gate = threading.Event()
        app = create_app(Settings(data_dir=tmp_path / f"server-{len(started)}", **settings),
                         backends=[gated_backend(gate)])
        served = Served(LiveServer(app).start(), gate)
        started.append(served)
        return served

    yield start
    for served in started:
        served.gate.set()
        served.server.stop()


def refused(reply: httpx.Response, limit: str) -> dict[str, Any]:
    """A 429 with the spec's error object naming ``limit``, and a Retry-After header."""
    assert reply.status_code == 429, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    body = reply.json()
    validate_error_body(body)
    error = body["error"]
    assert error["type"] == "too_many_requests" and error["code"] == "rate_limit_exceeded"
    assert limit in error["message"]
    assert int(reply.headers["retry-after"]) >= 1
    return error  # type: ignore[no-any-return]


def redis_settings(store: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if store == "memory":
        return {}
    return {"redis_url": request.getfixturevalue("redis_url"), "redis_prefix": request.getfixturevalue("redis_prefix")}


class OpenStream:
    """A ``stream: true`` request held open after its first events."""

    def __init__(self, url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.http = httpx.Client(base_url=url, timeout=60, headers=headers)
        self._context = self.http.stream("POST", "/v1/responses", json={**body, "stream": True})
        self.reply = self._context.__enter__()
        assert self.reply.status_code == 200
        self.lines = self.reply.iter_lines()
        self.until("event: response.in_progress")

    def until(self, wanted: str) -> list[str]:
        seen = []
        for line in self.lines:
            seen.append(line)
            if line.startswith(wanted):
                return seen
        raise AssertionError(f"the stream ended before {wanted!r}: {seen}")

    def close(self) -> None:
        self._context.__exit__(None, None, None)
        self.http.close()


def test_requests_per_minute(serve: Callable[..., Served]) -> None:
    served = serve(rate_limit_rpm=2)
    client = Client(served.url)
    first = client.create(**QUICK)
    client.create(**QUICK)
    reply = client.http.post("/v1/responses", json=QUICK)
    error = refused(reply, "2 requests per minute")
    assert 1 <= int(reply.headers["retry-after"]) <= 60
    refused(client.http.post("/v1/responses", json={**QUICK, "stream": True}), "requests per minute")
    refused(client.http.post("/v1/responses/compact", json=QUICK), "requests per minute")
    assert error["param"] is None
    # reading is not generating: retrieval, models and health are not counted
    assert client.http.get(f"/v1/responses/{first['id']}").status_code == 200
    assert client.http.get(f"/v1/responses/{first['id']}/input_items").status_code == 200
    assert client.http.get("/v1/models").status_code == 200
    assert client.http.get("/healthz").status_code == 200


def test_each_tenant_has_its_own_budget(serve: Callable[..., Served]) -> None:
    served = serve(rate_limit_rpm=1, api_keys=["alice:a-secret", "bob:b-secret", "alice:rotated"])
    alice, bob, alice_too = (Client(served.url, api_key=key) for key in ("a-secret", "b-secret", "rotated"))
    alice.create(**QUICK)
    refused(alice.http.post("/v1/responses", json=QUICK), "1 request per minute")
    refused(alice_too.http.post("/v1/responses", json=QUICK), "per minute")  # one name, one budget
    bob.create(**QUICK)
    # an unauthenticated request is a 401, not a 429, and counts nothing
    assert httpx.post(f"{served.url}/v1/responses", json=QUICK).status_code == 401


def test_compaction_is_counted(serve: Callable[..., Served]) -> None:
    served = serve(rate_limit_rpm=1)
    client = Client(served.url)
    assert client.http.post("/v1/responses/compact", json=QUICK).status_code == 200
    refused(client.http.post("/v1/responses", json=QUICK), "1 request per minute")


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_running_stream_holds_its_place_until_it_ends(
    serve: Callable[..., Served], store: str, request: pytest.FixtureRequest
) -> None:
    served = serve(rate_limit_concurrent=1, **redis_settings(store, request))
    client = Client(served.url)
    running = OpenStream(served.url, GATED)
    try:
        reply = client.http.post("/v1/responses", json=QUICK)
        refused(reply, "1 response in flight")
        assert reply.headers["retry-after"] == "1"
        refused(client.http.post("/v1/responses", json={**QUICK, "background": True}), "in flight")
        served.gate.set()
        tail = running.until("data: [DONE]")
        assert "event: response.completed" in tail
    finally:
        running.close()
    # the place is given back before [DONE] is sent
    assert client.create(**QUICK)["status"] == "completed"


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_client_that_leaves_gives_its_place_back(
    serve: Callable[..., Served], store: str, request: pytest.FixtureRequest
) -> None:
    served = serve(rate_limit_concurrent=1, **redis_settings(store, request))
    client = Client(served.url)
    running = OpenStream(served.url, {"model": "scripted-slow", "input": "x"})
    running.until("event: response.output_text.delta")
    refused(client.http.post("/v1/responses", json=QUICK), "in flight")
    running.close()
    assert wait_for(lambda: client.http.post("/v1/responses", json=QUICK).status_code == 200), \
        "the place of a stream whose client left was never given back"


def test_a_failure_before_the_stream_gives_the_place_back(serve: Callable[..., Served]) -> None:
    served = serve(rate_limit_concurrent=1)
    client = Client(served.url)
    assert client.error({"model": "no-such-model", "input": "x", "stream": True}, 404)["code"] == "model_not_found"
    client.error(None, 400, raw=b'{"model": "scripted-text", "input": ')
    assert client.stream(model="scripted-fail", input="x").final["status"] == "failed"  # fails mid-stream
    client.stream(**QUICK)
    client.create(**QUICK)


def test_a_background_response_holds_its_place_until_it_finishes(serve: Callable[..., Served]) -> None:
    served = serve(rate_limit_concurrent=1)
    client = Client(served.url)
    started = client.create(**GATED, background=True)
    refused(client.http.post("/v1/responses", json=QUICK), "in flight")
    served.gate.set()
    assert wait_for(lambda: client.http.get(f"/v1/responses/{started['id']}").json()["status"] == "completed")
    assert wait_for(lambda: client.http.post("/v1/responses", json=QUICK).status_code == 200)


def test_websocket_refusals_are_error_envelopes_and_the_socket_stays_open(serve: Callable[..., Served]) -> None:
    served = serve(rate_limit_concurrent=1, rate_limit_rpm=2)
    url = served.url.replace("http://", "ws://") + "/v1/responses"
    with connect(url, open_timeout=10) as socket:
        running = OpenStream(served.url, GATED)
        try:
            socket.send(json.dumps({"type": "response.create", **QUICK}))
            envelope = json.loads(socket.recv(timeout=30))
            validate_ws_error(envelope)
            assert envelope["status"] == 429 and envelope["error"]["code"] == "rate_limit_exceeded"
            assert "in flight" in envelope["error"]["message"]
            served.gate.set()
            running.until("data: [DONE]")
        finally:
            running.close()
        socket.send(json.dumps({"type": "response.create", **QUICK}))
        while (message := json.loads(socket.recv(timeout=30)))["type"] != "response.completed":
            assert message["type"] != "error", message
        # the stream and that turn were the minute's two requests (the refusal counted nothing):
        # the next is refused, on the same socket
        socket.send(json.dumps({"type": "response.create", **QUICK}))
        envelope = json.loads(socket.recv(timeout=30))
        validate_ws_error(envelope)
        assert envelope["status"] == 429 and "2 requests per minute" in envelope["error"]["message"]


def test_a_websocket_turn_holds_its_place_while_its_response_runs(serve: Callable[..., Served]) -> None:
    served = serve(rate_limit_concurrent=1)
    client = Client(served.url)
    url = served.url.replace("http://", "ws://") + "/v1/responses"
    with connect(url, open_timeout=10) as socket:
        socket.send(json.dumps({"type": "response.create", **GATED}))
        while json.loads(socket.recv(timeout=30))["type"] != "response.in_progress":
            pass
        refused(client.http.post("/v1/responses", json=QUICK), "1 response in flight")
        served.gate.set()
        while (message := json.loads(socket.recv(timeout=30)))["type"] != "response.completed":
            assert message["type"] != "error", message
    assert wait_for(lambda: client.http.post("/v1/responses", json=QUICK).status_code == 200)


def test_two_servers_share_one_redis_budget(serve: Callable[..., Served], redis_url: str, redis_prefix: str) -> None:
    shared = {"redis_url": redis_url, "redis_prefix": redis_prefix, "rate_limit_rpm": 3, "rate_limit_concurrent": 1}
    one, two = serve(**shared), serve(**shared)
    running = OpenStream(one.url, GATED)
    try:
        refused(httpx.post(f"{two.url}/v1/responses", json=QUICK, timeout=30), "in flight")
        one.gate.set()
        running.until("data: [DONE]")
    finally:
        running.close()
    Client(two.url).create(**QUICK)
    Client(one.url).create(**QUICK)  # the third of the minute, across both servers
    refused(httpx.post(f"{two.url}/v1/responses", json=QUICK, timeout=30), "3 requests per minute")
    refused(httpx.post(f"{one.url}/v1/responses", json=QUICK, timeout=30), "3 requests per minute")
