from __future__ import annotations

import json

import httpx
import pytest
from stream_factory import CREATED_AT, StreamBuilder, make_response, make_usage, to_sse

from compliance.__main__ import main
from compliance.suite import REGISTRY, Session, SuiteConfig, run, select

CONFIG = SuiteConfig(base_url="http://server.test/v1", model="test-model", api_key="secret")
MESSAGE = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
           "content": [{"type": "output_text", "text": "Hello there friend", "annotations": []}]}
CALL = {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1",
        "name": "get_weather", "arguments": '{"location": "San Francisco, CA"}'}


def conformant_server(request: httpx.Request, *, offer_compact: bool = True, newline: str = "\n") -> httpx.Response:
    assert request.headers["authorization"] == "Bearer secret"
    body = json.loads(request.content)
    if request.url.path == "/v1/responses/compact":
        if not offer_compact:
            return httpx.Response(404, json={"error": {"type": "not_found", "code": None, "param": None,
                                                       "message": "no such path"}})
        if "model" not in body:
            return httpx.Response(400, json={"error": {"type": "invalid_request", "code": "missing_required_parameter",
                                                       "param": "model", "message": "model is required"}})
        return httpx.Response(200, json={
            "id": "resp_compact", "object": "response.compaction", "created_at": CREATED_AT, "usage": make_usage(),
            "output": [{"id": "cmp_1", "type": "compaction", "encrypted_content": "opaque"}]})
    if body.get("stream"):
        builder = StreamBuilder()
        builder.message(["1, 2", ", 3, 4, 5"])
        builder.completed()
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=to_sse(builder.events, newline=newline))
    output = [CALL] if body.get("tools") else [MESSAGE]
    return httpx.Response(200, json=make_response(status="completed", completed_at=CREATED_AT + 1, output=output,
                                                  usage=make_usage()))


def run_against(handler) -> dict[str, str]:
    session = Session(CONFIG)
    session.resources["http"] = httpx.Client(transport=httpx.MockTransport(handler), headers=CONFIG.headers())
    checks = select(transports=["http", "fixture"])
    return {outcome.name: outcome.line() for outcome in run(CONFIG, checks, session=session)}


def test_conformant_server_passes_every_check():
    lines = run_against(conformant_server)
    assert set(lines) == {name for name, check in REGISTRY.items() if check.transport in ("http", "fixture")}
    assert all(line.startswith("PASS ") for line in lines.values()), lines


def test_compact_is_skipped_when_not_offered():
    lines = run_against(lambda request: conformant_server(request, offer_compact=False))
    assert lines["compact-response"].startswith("SKIP compact-response: the server does not offer")
    assert lines["compact-missing-model"].startswith("SKIP ")
    assert lines["basic-response"] == "PASS basic-response"


def test_badly_framed_stream_fails_only_the_streaming_check():
    lines = run_against(lambda request: conformant_server(request, newline="\r\n"))
    assert lines["streaming-response"].startswith("FAIL streaming-response: line 1 contains a carriage return")
    assert lines["basic-response"] == "PASS basic-response"


def test_http_errors_fail_with_status_and_body():
    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": {"type": "server_error", "code": None, "param": None,
                                                   "message": "boom"}})
    lines = run_against(broken)
    assert lines["basic-response"].startswith("FAIL basic-response: HTTP 500 (expected 200)")


def test_missing_model_must_be_rejected_with_a_spec_error_body():
    def fastapi_default(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/compact") and "model" not in json.loads(request.content):
            return httpx.Response(422, json={"detail": [{"loc": ["body", "model"], "msg": "Field required"}]})
        return conformant_server(request)
    lines = run_against(fastapi_default)
    assert lines["compact-missing-model"].startswith(
        "FAIL compact-missing-model: HTTP error body is invalid at $: 'error' is a required property")


def test_cli_lists_checks(capsys):
    assert main(["--list"]) == 0
    assert "streaming-response" in capsys.readouterr().out


def test_cli_exits_non_zero_when_the_server_is_unreachable(capsys):
    assert main(["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--only", "basic-response",
                 "--timeout", "5"]) == 1
    assert capsys.readouterr().out.startswith("FAIL basic-response: ConnectError")


def test_cli_rejects_unknown_check_names(capsys):
    assert main(["--model", "m", "--only", "nope"]) == 2


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_check_is_described(name):
    assert REGISTRY[name].description
