"""The exposure guards against the real server on 127.0.0.1: Host, Origin, CORS,
Content-Type, body size, WebSocket message size and queued frames. Every refusal must be
the spec's error object (or WebSocket error envelope), checked by ``compliance``."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from app.backends.base import GenerationRequest
from app.backends.scripted import ScriptedBackend, text_script
from app.config import Settings
from app.main import create_app
from compliance import check_response, check_stream, validate_error_body, validate_ws_error
from tests.live import LiveServer

LIMIT = 4096
BODY = b'{"model": "scripted-text", "input": "x"}'
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


class Gate:
    """A model whose answer waits until the test opens the gate (a thread event, as the
    server runs in another thread)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    async def __call__(self, request: GenerationRequest) -> list[Any]:
        await asyncio.to_thread(self.event.wait, 60)
        return text_script("opened")


@pytest.fixture(scope="module")
def gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.event.set()


def _server(tmp: Path, gate: Gate | None = None, **settings: Any) -> LiveServer:
    scripts: dict[str, Any] = {"scripted-text": text_script("Hello", ".")}
    if gate is not None:
        scripts["gated"] = gate
    app = create_app(Settings(data_dir=tmp, **settings), backends=[ScriptedBackend(scripts)])
    return LiveServer(app).start()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, gate: Gate) -> Iterator[LiveServer]:
    server = _server(tmp_path_factory.mktemp("guards"), gate, max_body_bytes=LIMIT,
                     allowed_hosts=["ors.internal"], ws_max_queued_frames=1)
    yield server
    gate.event.set()
    server.stop()


@pytest.fixture(scope="module")
def with_origins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = _server(tmp_path_factory.mktemp("origins"), allowed_origins=["https://app.example"])
    yield server
    server.stop()


def _error(reply: httpx.Response | http.client.HTTPResponse, status: int, code: str) -> dict[str, Any]:
    body = json.loads(reply.read() if isinstance(reply, http.client.HTTPResponse) else reply.content)
    assert reply.status == status if isinstance(reply, http.client.HTTPResponse) else reply.status_code == status
    validate_error_body(body)
    assert body["error"]["code"] == code, body
    return body["error"]  # type: ignore[no-any-return]


def _ws(server: LiveServer) -> str:
    return server.url.replace("http://", "ws://") + "/v1/responses"


# -- Content-Type ------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", [
    "text/plain",
    "text/plain;charset=UTF-8",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=latin-1",
    "application/json-patch+json",
    None,
])
def test_posts_must_be_json(guarded: LiveServer, content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    for path in ("/v1/responses", "/v1/responses/compact", "/v1/responses/resp_x/cancel"):
        reply = httpx.post(guarded.url + path, content=BODY, headers=headers)
        error = _error(reply, 415, "unsupported_media_type")
        assert error["param"] is None


def test_a_post_without_body_or_type_passes(guarded: LiveServer) -> None:
    """Nothing to parse (``curl -X POST …/cancel``): it reaches the route."""
    reply = httpx.post(guarded.url + "/v1/responses/resp_unknown/cancel")
    assert "content-type" not in reply.request.headers
    _error(reply, 404, "response_not_found")
    empty_form = httpx.post(guarded.url + "/v1/responses/resp_unknown/cancel",
                            headers={"Content-Type": "application/x-www-form-urlencoded"})
    _error(empty_form, 415, "unsupported_media_type")


@pytest.mark.parametrize("content_type", [
    "application/json", "application/json; charset=utf-8", 'Application/JSON;Charset="UTF-8"',
])
def test_json_posts_pass(guarded: LiveServer, content_type: str) -> None:
    reply = httpx.post(guarded.url + "/v1/responses", content=BODY, headers={"Content-Type": content_type})
    assert reply.status_code == 200, reply.text
    assert check_response(reply.json())["status"] == "completed"


# -- body size ---------------------------------------------------------------------------


def test_a_declared_length_over_the_limit_is_refused_before_reading(guarded: LiveServer) -> None:
    """No byte of the body is sent: a server that waited to read it would never answer."""
    connection = http.client.HTTPConnection("127.0.0.1", guarded.port, timeout=60)
    try:
        connection.putrequest("POST", "/v1/responses")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(LIMIT + 1))
        connection.endheaders()
        _error(connection.getresponse(), 413, "request_too_large")
    finally:
        connection.close()


def _padded(size: int) -> bytes:
    return BODY[:-1] + b" " * (size - len(BODY)) + b"}"


def test_a_body_of_exactly_the_limit_passes(guarded: LiveServer) -> None:
    reply = httpx.post(guarded.url + "/v1/responses", content=_padded(LIMIT),
                       headers={"Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text


def _chunks(body: bytes, size: int = 1000) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def test_a_chunked_body_is_counted_while_read(guarded: LiveServer) -> None:
    headers = {"Content-Type": "application/json"}
    small = httpx.post(guarded.url + "/v1/responses", content=_chunks(_padded(LIMIT)), headers=headers)
    assert small.request.headers.get("transfer-encoding") == "chunked"
    assert small.status_code == 200, small.text
    big = httpx.post(guarded.url + "/v1/responses", content=_chunks(_padded(LIMIT + 1)), headers=headers)
    assert big.request.headers.get("transfer-encoding") == "chunked"
    _error(big, 413, "request_too_large")


# -- bodies in flight ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Gate]]:
    """Room for two bodies of the largest size at once; a model that waits for its gate."""
    gate = Gate()
    server = _server(tmp_path_factory.mktemp("budget"), gate, max_body_bytes=LIMIT,
                     max_body_bytes_in_flight=2 * LIMIT)
    yield server, gate
    gate.event.set()
    server.stop()


def _holding(server: LiveServer, length: int = LIMIT) -> socket.socket:
    """A request whose headers declare ``length`` bytes and whose body has only begun."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n{" % length)
    return sock


def _admitted_soon(server: LiveServer) -> httpx.Response:
    """A body of the largest size, sent again while the server refuses it as busy (the
    bytes of a request that ended are given back once its handler has returned)."""
    for _ in range(100):
        reply = httpx.post(server.url + "/v1/responses", content=_padded(LIMIT),
                           headers={"Content-Type": "application/json"})
        if reply.status_code != 429:
            return reply
        threading.Event().wait(0.05)
    return reply


def test_bodies_past_the_bound_are_busy_until_one_ends(budgeted: tuple[LiveServer, Gate]) -> None:
    """Two bodies of the largest size, still arriving, take all the room: a third
    request, however small, is 429 ``server_busy`` with ``Retry-After``; a client that
    leaves gives its room back."""
    server, _ = budgeted
    first, second = _holding(server), _holding(server)
    try:
        busy = httpx.post(server.url + "/v1/responses", content=BODY, headers={"Content-Type": "application/json"})
        error = _error(busy, 429, "server_busy")
        assert busy.headers["retry-after"] == "1" and "ORS_MAX_BODY_BYTES_IN_FLIGHT" in error["message"]
        chunked = httpx.post(server.url + "/v1/responses", content=_chunks(_padded(LIMIT)),
                             headers={"Content-Type": "application/json"})
        assert chunked.request.headers.get("transfer-encoding") == "chunked"
        _error(chunked, 429, "server_busy")  # counted as its chunks arrive
        first.close()
        reply = _admitted_soon(server)
        assert reply.status_code == 200, reply.text
        check_response(reply.json())
    finally:
        first.close()
        second.close()
    assert _admitted_soon(server).status_code == 200


def test_a_stream_holds_its_body_until_it_ends(budgeted: tuple[LiveServer, Gate]) -> None:
    """What a request's body became lives as long as its response: two streams waiting
    on their model hold the room; once they end, it is free."""
    server, gate = budgeted
    gate.event.clear()
    body = json.dumps({"model": "gated", "input": "x" * (LIMIT - 200), "stream": True}).encode()
    replies: list[int] = []
    ended: list[str] = []

    def stream() -> None:
        with httpx.stream("POST", server.url + "/v1/responses", content=body, timeout=60,
                          headers={"Content-Type": "application/json"}) as reply:
            replies.append(reply.status_code)
            events = [json.loads(line[6:]) for line in reply.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        check_stream(events, expect_done=False)
        ended.append(events[-1]["type"])

    streams = [threading.Thread(target=stream) for _ in range(2)]
    for thread in streams:
        thread.start()
    try:
        for _ in range(200):
            if len(replies) == 2:
                break
            threading.Event().wait(0.02)
        assert replies == [200, 200]
        big = httpx.post(server.url + "/v1/responses", content=_padded(LIMIT),
                         headers={"Content-Type": "application/json"})
        _error(big, 429, "server_busy")
    finally:
        gate.event.set()
        for thread in streams:
            thread.join(60)
    assert ended == ["response.completed", "response.completed"]
    assert _admitted_soon(server).status_code == 200


def test_websocket_frames_count_until_their_turn_ends(budgeted: tuple[LiveServer, Gate]) -> None:
    """A ``response.create`` frame holds its room while its turn runs, as a body does: with
    two large turns waiting on their model, a third connection's frame is answered with
    ``server_busy`` and dropped, and the connection stays usable; once the turns end,
    the room is free."""
    server, gate = budgeted
    gate.event.clear()
    large = json.dumps({"type": "response.create", "model": "gated", "input": "x" * (LIMIT - 200)})
    small = json.dumps({"type": "response.create", "model": "scripted-text", "input": "x"}).ljust(400)
    assert 2 * len(large) + len(small) > 2 * LIMIT
    with connect(_ws(server), open_timeout=10) as one, connect(_ws(server), open_timeout=10) as two, \
            connect(_ws(server), open_timeout=10) as three:
        held = []
        for ws in (one, two):
            ws.send(large)
            held.append([json.loads(ws.recv(timeout=30)) for _ in range(2)])  # created, in_progress
        three.send(small)
        refused = json.loads(three.recv(timeout=30))
        validate_ws_error(refused)
        assert refused["status"] == 429 and refused["error"]["code"] == "server_busy"
        gate.event.set()
        for ws, first in zip((one, two), held, strict=True):
            final = check_stream([*first, *_rest_of_turn(ws)], expect_done=False, transport="websocket")
            assert final["status"] == "completed"
        for _ in range(100):  # the turns' room is given back once their handlers return
            three.send(small)
            reply = json.loads(three.recv(timeout=30))
            if reply.get("type") != "error":
                break
            threading.Event().wait(0.05)
        final = check_stream([reply, *_rest_of_turn(three)], expect_done=False, transport="websocket")
        assert final["status"] == "completed"
    assert _admitted_soon(server).status_code == 200


def test_a_websocket_message_over_the_limit_closes_with_1009(guarded: LiveServer) -> None:
    with connect(_ws(guarded), open_timeout=10) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "scripted-text", "input": "x" * LIMIT}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def _rest_of_turn(ws: Any) -> list[dict[str, Any]]:
    events = [json.loads(ws.recv(timeout=60))]
    while events[-1]["type"] not in TERMINAL:
        events.append(json.loads(ws.recv(timeout=60)))
    return events


def test_queued_frames_beyond_the_limit_get_an_error_and_the_socket_stays_open(
    guarded: LiveServer, gate: Gate
) -> None:
    gate.event.clear()

    def create(model: str) -> str:
        return json.dumps({"type": "response.create", "model": model, "input": "x"})

    def turn(ws: Any) -> dict[str, Any]:
        return check_stream(_rest_of_turn(ws), expect_done=False, transport="websocket")

    with connect(_ws(guarded), open_timeout=10) as ws:
        ws.send(create("gated"))
        first = [json.loads(ws.recv(timeout=30)) for _ in range(2)]
        assert [event["type"] for event in first] == ["response.created", "response.in_progress"]  # held
        ws.send(create("scripted-text"))  # waits behind it: the one frame allowed
        ws.send(create("scripted-text"))  # one too many
        refused = json.loads(ws.recv(timeout=30))  # at once, while the first turn still waits
        validate_ws_error(refused)
        assert refused["status"] == 429
        assert (refused["error"]["code"], refused["error"]["param"]) == ("too_many_queued_frames", "type")
        gate.event.set()
        final = check_stream([*first, *_rest_of_turn(ws)], expect_done=False, transport="websocket")
        assert final["output"][0]["content"][0]["text"] == "opened"
        assert turn(ws)["status"] == "completed"  # the queued frame
        ws.send(create("scripted-text"))
        assert turn(ws)["status"] == "completed"  # the connection is still usable


# -- Host --------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "localhost.evil"])
def test_foreign_hosts_are_refused_on_a_loopback_bind(guarded: LiveServer, host: str) -> None:
    reply = httpx.post(guarded.url + "/v1/responses", content=BODY,
                       headers={"Host": host, "Content-Type": "application/json"})
    _error(reply, 403, "host_not_allowed")
    _error(httpx.get(guarded.url + "/healthz", headers={"Host": host}), 403, "host_not_allowed")


@pytest.mark.parametrize("host", ["localhost", "localhost:1234", "127.0.0.1", "[::1]:8080", "[::1]",
                                  "ors.internal", "ORS.Internal:443"])
def test_loopback_names_and_allowed_hosts_pass(guarded: LiveServer, host: str) -> None:
    reply = httpx.post(guarded.url + "/v1/responses", content=BODY,
                       headers={"Host": host, "Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text


def test_no_host_check_when_not_bound_to_loopback(tmp_path: Path) -> None:
    server = _server(tmp_path, host="0.0.0.0", api_keys=["k"])
    try:
        reply = httpx.get(server.url + "/healthz", headers={"Host": "ors.example.com"})
        assert reply.status_code == 200
    finally:
        server.stop()


def _raw_upgrade(port: int, host: str) -> tuple[int, dict[str, Any]]:
    """A WebSocket upgrade with a chosen Host header; the status and the JSON body."""
    request = (
        f"GET /v1/responses HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request.encode())
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += sock.recv(4096)
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        while len(body) < int(headers.get("content-length", 0)):
            body += sock.recv(4096)
    return int(lines[0].split()[1]), json.loads(body) if body else {}


def test_websocket_upgrades_pass_the_host_check_too(guarded: LiveServer) -> None:
    status, body = _raw_upgrade(guarded.port, "evil.example")
    assert status == 403
    validate_error_body(body)
    assert body["error"]["code"] == "host_not_allowed"
    assert _raw_upgrade(guarded.port, f"127.0.0.1:{guarded.port}")[0] == 101


# -- Origin and CORS ---------------------------------------------------------------------


def test_websocket_from_a_foreign_origin_is_refused(guarded: LiveServer, with_origins: LiveServer) -> None:
    for server in (guarded, with_origins):
        with pytest.raises(InvalidStatus) as refused:
            connect(_ws(server), origin="https://evil.example", open_timeout=10)  # type: ignore[arg-type]
        assert refused.value.response.status_code == 403
        body = json.loads(refused.value.response.body)
        validate_error_body(body)
        assert body["error"]["code"] == "origin_not_allowed"


def _one_turn(url: str, **options: Any) -> dict[str, Any]:
    with connect(url, open_timeout=10, **options) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "scripted-text", "input": "x"}))
        events = []
        while not events or events[-1]["type"] not in TERMINAL:
            events.append(json.loads(ws.recv(timeout=30)))
    return check_stream(events, expect_done=False, transport="websocket")


def test_websocket_without_origin_or_from_an_allowed_one_is_served(
    guarded: LiveServer, with_origins: LiveServer
) -> None:
    assert _one_turn(_ws(guarded))["status"] == "completed"  # SDKs and CLIs send no Origin
    assert _one_turn(_ws(with_origins), origin="https://app.example")["status"] == "completed"


def _preflight(server: LiveServer, origin: str) -> httpx.Response:
    return httpx.options(server.url + "/v1/responses", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    })


def test_cors_when_configured(with_origins: LiveServer) -> None:
    allowed = _preflight(with_origins, "https://app.example")
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in allowed.headers["access-control-allow-methods"]
    _error(_preflight(with_origins, "https://evil.example"), 403, "cors_not_allowed")
    headers = {"Origin": "https://app.example", "Content-Type": "application/json"}
    reply = httpx.post(with_origins.url + "/v1/responses", content=BODY, headers=headers)
    assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == "https://app.example"
    refused = httpx.post(with_origins.url + "/v1/responses", content=BODY,
                         headers={**headers, "Content-Type": "text/plain"})
    _error(refused, 415, "unsupported_media_type")
    assert refused.headers["access-control-allow-origin"] == "https://app.example"  # readable by the page


def test_no_cors_unless_configured(guarded: LiveServer) -> None:
    preflight = _preflight(guarded, "https://app.example")
    assert preflight.status_code >= 400
    validate_error_body(preflight.json())
    assert not any(name.startswith("access-control-") for name in preflight.headers)
    reply = httpx.post(guarded.url + "/v1/responses", content=BODY,
                       headers={"Origin": "https://app.example", "Content-Type": "application/json"})
    assert reply.status_code == 200
    assert not any(name.startswith("access-control-") for name in reply.headers)
