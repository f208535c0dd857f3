from __future__ import annotations

import json
import socketserver
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from stream_factory import CREATED_AT, StreamBuilder, make_usage

from compliance import ConformanceError
from compliance.suite import Session, Skip, SuiteConfig, run, select
from compliance.ws_checks import (
    NOT_FOUND,
    TURN_TIMEOUT,
    Turn,
    TurnReader,
    WebSocketConnector,
    ends_turn,
    error_code,
    parse_message,
    turn_timeout,
    websocket_url,
)

CONFIG = SuiteConfig(base_url="http://server.test/v1", model="test-model", api_key="secret")
WS_CHECKS = [
    "websocket-response",
    "websocket-sequential-responses",
    "websocket-continuation",
    "websocket-reconnect-store-false-recovery",
    "websocket-previous-response-not-found",
    "websocket-failed-continuation-evicts-cache",
    "websocket-compact-new-chain",
]


def envelope(code: str, status: int = 400, **error: Any) -> dict[str, Any]:
    return {"type": "error", "status": status, "error": {"type": "invalid_request", "code": code,
                                                         "message": f"failed with {code}", "param": None, **error}}


def completed_events(response_id: str = "resp_1", previous: str | None = None) -> list[dict[str, Any]]:
    builder = StreamBuilder()
    builder.message(["Hello", " there"])
    builder.completed()
    for event in builder.events:
        if "response" in event:
            event["response"].update(id=response_id, previous_response_id=previous, store=False)
    return builder.events


def failed_events() -> list[dict[str, Any]]:
    builder = StreamBuilder()
    builder.failed(code="upstream_unavailable")
    return builder.events


def read(frames: list[Any]) -> tuple[TurnReader, list[bool]]:
    reader = TurnReader()
    return reader, [reader.feed(frame if isinstance(frame, (str, bytes)) else json.dumps(frame)) for frame in frames]


class FakeConnection:
    """One connection to an in-memory server that keeps store:false ids in connection-local memory."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.cache: set[str] = set()
        self.pending: deque[str] = deque()

    def send(self, message: str) -> None:
        request = json.loads(message)
        self.server.requests.append(request)
        assert request["type"] == "response.create" and request["model"] == "test-model"
        previous = request.get("previous_response_id")
        found = previous is None or (previous in self.cache) or self.server.forgetful
        inputs = request["input"] if isinstance(request["input"], list) else []
        if not found:
            self.pending.append(json.dumps(envelope(NOT_FOUND, param="previous_response_id")))
        elif any(item.get("type") == "function_call_output" for item in inputs):
            self.cache.discard(previous)
            self.pending.append(json.dumps(envelope("invalid_request", param="input")))
        else:
            self.server.created += 1
            response_id = f"resp_{self.server.created}"
            self.cache = {response_id}
            self.pending.extend(json.dumps(event) for event in completed_events(response_id, previous))
        self.pending.extend(self.server.trailer)

    def recv(self, timeout: float | None = None) -> str:
        if not self.pending:
            raise TimeoutError
        return self.pending.popleft()

    def close(self) -> None:
        self.server.closed += 1


class FakeServer:
    """A connector whose connections talk to one in-memory server."""

    def __init__(self, *, trailer: tuple[str, ...] = (), forgetful: bool = False) -> None:
        self.trailer = trailer
        self.forgetful = forgetful
        self.requests: list[dict[str, Any]] = []
        self.created = 0
        self.closed = 0

    def open(self) -> FakeConnection:
        return FakeConnection(self)


def compact_server(request: httpx.Request) -> httpx.Response:
    assert request.url.path == "/v1/responses/compact"
    return httpx.Response(200, json={
        "id": "resp_compact", "object": "response.compaction", "created_at": CREATED_AT, "usage": make_usage(),
        "output": [{"id": "cmp_1", "type": "compaction", "encrypted_content": "opaque"}]})


def run_ws(connector: Any, compact: Any = compact_server) -> dict[str, str]:
    session = Session(CONFIG)
    session.resources["websocket"] = connector
    session.resources["http"] = httpx.Client(transport=httpx.MockTransport(compact), headers=CONFIG.headers())
    return {outcome.name: outcome.line() for outcome in run(CONFIG, select(transports=["websocket"]), session=session)}


@pytest.mark.parametrize(("base_url", "expected"), [
    ("http://127.0.0.1:8080/v1", "ws://127.0.0.1:8080/v1/responses"),
    ("https://api.example.com/v1/", "wss://api.example.com/v1/responses"),
    ("HTTP://host/prefix/v1", "ws://host/prefix/v1/responses"),
    ("wss://host/v1", "wss://host/v1/responses"),
])
def test_websocket_url_is_responses_under_the_base_url(base_url: str, expected: str) -> None:
    assert websocket_url(base_url) == expected


def test_websocket_url_rejects_other_schemes() -> None:
    with pytest.raises(ValueError, match="ftp://host/v1"):
        websocket_url("ftp://host/v1")


def test_turn_timeout_is_the_harness_limit_unless_the_run_sets_one() -> None:
    assert turn_timeout(CONFIG) == TURN_TIMEOUT == 30
    assert turn_timeout(SuiteConfig(base_url="http://x/v1", model="m", timeout=5)) == 5
    assert turn_timeout(SuiteConfig(base_url="http://x/v1", model="m", timeout=120)) == 120


@pytest.mark.parametrize(("message_type", "ends"), [
    ("response.completed", True), ("response.failed", True), ("response.incomplete", True), ("error", True),
    ("response.created", False), ("response.in_progress", False), ("response.output_text.delta", False),
])
def test_a_turn_ends_at_a_terminal_event_or_an_error_message(message_type: str, ends: bool) -> None:
    assert ends_turn({"type": message_type}) is ends


def test_error_code_reads_an_envelope_or_a_response() -> None:
    assert error_code(envelope(NOT_FOUND)) == NOT_FOUND
    assert error_code(failed_events()[-1]["response"]) == "upstream_unavailable"
    assert error_code(completed_events()[-1]["response"]) is None
    assert error_code({"error": {"code": None, "message": "m"}}) is None
    assert error_code({"error": "not an object"}) is None
    assert error_code(None) is None


def test_the_turn_error_code_prefers_the_envelope() -> None:
    failed = failed_events()[-1]["response"]
    assert Turn(error=envelope(NOT_FOUND)).error_code == NOT_FOUND
    assert Turn(response=failed).error_code == "upstream_unavailable"
    assert Turn(error=envelope(NOT_FOUND), response=failed).error_code == NOT_FOUND
    assert Turn(response=failed).failed and Turn(error=envelope("x")).failed
    assert not Turn(response=completed_events()[-1]["response"]).failed


@pytest.mark.parametrize(("frame", "message"), [
    ("[DONE]", r"\[DONE\] on WebSocket"),
    (b'{"type": "response.created"}', "a binary frame"),
    ("event: response.created", "a frame that is not JSON"),
    ("[1, 2]", "not a JSON object"),
])
def test_frames_that_are_not_json_event_objects_are_violations(frame: str | bytes, message: str) -> None:
    with pytest.raises(ConformanceError, match=message):
        parse_message(frame)


def test_the_reader_ends_the_turn_at_the_terminal_event() -> None:
    events = completed_events()
    reader, ended = read(events)
    assert ended == [False] * (len(events) - 1) + [True]
    assert reader.turn is not None and reader.turn.response == events[-1]["response"]
    assert reader.turn.events == events and reader.turn.error is None


def test_a_failed_response_ends_the_turn_with_its_code() -> None:
    reader, ended = read(failed_events())
    assert ended[-1] and reader.turn is not None
    assert reader.turn.failed and reader.turn.error_code == "upstream_unavailable"


def test_an_error_envelope_before_any_event_ends_the_turn() -> None:
    reader, ended = read([envelope(NOT_FOUND, param="previous_response_id")])
    assert ended == [True]
    assert reader.turn is not None and reader.turn.events == [] and reader.turn.error_code == NOT_FOUND


@pytest.mark.parametrize(("bad", "message"), [
    ({"type": "error", "error": {"code": NOT_FOUND, "message": "m"}}, "'status' is a required property"),
    ({"type": "error", "status": 400, "error": {"message": "m"}}, "'code' is a required property"),
    (envelope(NOT_FOUND, status=200), "status 200"),
])
def test_an_error_envelope_must_be_a_websocket_error_event(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ConformanceError, match=message):
        read([bad])


def test_an_error_event_after_the_response_started_is_a_violation() -> None:
    builder = StreamBuilder()
    builder.error()
    builder.failed()
    with pytest.raises(ConformanceError, match="must not carry an 'error' event"):
        read(builder.events)


def test_events_pass_the_stream_checker() -> None:
    events = completed_events()
    events[-1]["response"]["output"] = []
    with pytest.raises(ConformanceError, match="0 output items but 1 were streamed"):
        read(events)


def test_nothing_is_read_after_the_end_of_the_turn() -> None:
    with pytest.raises(ConformanceError, match="after the end of the turn"):
        read([envelope(NOT_FOUND), envelope(NOT_FOUND)])


def test_the_websocket_checks_are_the_harness_tests_in_order() -> None:
    checks = select(transports=["websocket"])
    assert [check.name for check in checks] == WS_CHECKS


def test_a_conformant_server_passes_every_websocket_check() -> None:
    server = FakeServer()
    lines = run_ws(server)
    assert list(lines) == WS_CHECKS
    assert all(line.startswith("PASS ") for line in lines.values()), lines
    continuation = [r for r in server.requests if r.get("previous_response_id")]
    assert all(r["store"] is False for r in continuation)
    assert server.closed == 8  # one socket per check, two for the reconnect check


def test_done_after_a_turn_fails_on_the_next_turn_or_at_close() -> None:
    lines = run_ws(FakeServer(trailer=("[DONE]",)))
    assert lines["websocket-response"].startswith("FAIL websocket-response: turn 1: [DONE] arrived after the turn")
    assert lines["websocket-sequential-responses"].startswith(
        "FAIL websocket-sequential-responses: turn 2: [DONE] on WebSocket")


def test_a_server_that_continues_unknown_ids_fails_the_not_found_checks() -> None:
    lines = run_ws(FakeServer(forgetful=True))
    assert lines["websocket-previous-response-not-found"] == (
        "FAIL websocket-previous-response-not-found: turn 1: expected the error code "
        "'previous_response_not_found', got a completed response")
    assert lines["websocket-reconnect-store-false-recovery"].startswith(
        "FAIL websocket-reconnect-store-false-recovery: socket B, turn 1: expected the error code")
    assert lines["websocket-response"] == "PASS websocket-response"


def test_a_turn_without_a_terminal_event_times_out() -> None:
    class Silent(FakeServer):
        def open(self) -> FakeConnection:
            connection = FakeConnection(self)
            connection.send = lambda message: None  # type: ignore[method-assign]
            return connection

    lines = run_ws(Silent())
    assert lines["websocket-response"] == (
        "FAIL websocket-response: turn 1: no terminal event within 30 s (0 events received)")


def test_compact_new_chain_is_skipped_when_compaction_is_not_offered() -> None:
    lines = run_ws(FakeServer(), compact=lambda request: httpx.Response(404, json={"error": {}}))
    assert lines["websocket-compact-new-chain"].startswith(
        "SKIP websocket-compact-new-chain: the server does not offer POST /responses/compact (HTTP 404)")


def test_the_compacted_window_starts_the_new_chain() -> None:
    server = FakeServer()
    run_ws(server)
    [request] = [r for r in server.requests if r["input"] and isinstance(r["input"], list)
                 and r["input"][0].get("type") == "compaction"]
    assert "previous_response_id" not in request and request["input"][-1]["role"] == "user"


class _Refusing(socketserver.BaseRequestHandler):
    status = "404 Not Found"

    def handle(self) -> None:
        self.request.recv(65536)
        body = b'{"error": "no websocket here"}'
        self.request.sendall(f"HTTP/1.1 {self.status}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)


@pytest.fixture()
def refusing_server(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("Handler", (_Refusing,), {"status": request.param})
    with socketserver.TCPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
        server.shutdown()


@pytest.mark.parametrize("refusing_server", ["404 Not Found", "405 Method Not Allowed"], indirect=True)
def test_an_upgrade_answered_404_or_405_means_the_transport_is_not_offered(refusing_server: str) -> None:
    with pytest.raises(Skip, match="does not offer the WebSocket transport at ws://.*/v1/responses"):
        WebSocketConnector(SuiteConfig(base_url=refusing_server, model="m")).open()


@pytest.mark.parametrize("refusing_server", ["403 Forbidden"], indirect=True)
def test_any_other_refusal_of_the_upgrade_fails(refusing_server: str) -> None:
    with pytest.raises(ConformanceError, match="refused the WebSocket upgrade .*: HTTP 403: .*no websocket here"):
        WebSocketConnector(SuiteConfig(base_url=refusing_server, model="m")).open()
