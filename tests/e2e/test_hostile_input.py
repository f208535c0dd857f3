"""Hostile and oversized requests against the real server: each is a precise 400 with the
spec's error object and a ``param``, never a 500, and nothing is fetched or frozen.

Over HTTP (``tests.client`` validates every error body against the vendored spec) and
over the WebSocket (the error envelope is validated by ``compliance``).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.sync.client import connect

from app.engine.limits import (
    DEFAULT_MAX_INPUT_ITEMS,
    DEFAULT_MAX_JSON_DEPTH,
    DEFAULT_MAX_JSON_VALUES,
    DEFAULT_MAX_TOOLS,
)
from app.schemas import DEFAULT_MAX_SCHEMA_BYTES
from compliance import validate_ws_error
from tests.client import Client
from tests.conftest import SMOL
from tests.live import LiveServer

EVIL_PATTERN = "^(a+)+$"


def _tool(name: str = "lookup", parameters: Any = None) -> dict[str, Any]:
    return {"type": "function", "name": name,
            "parameters": parameters or {"type": "object", "properties": {"code": {"type": "string"}}}}


@contextlib.contextmanager
def _counting_http_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback server that records every request it gets (a fetched ``$ref`` would)."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"type": "string"}')

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}", hits
        finally:
            server.shutdown()


# ---------------------------------------------------------------- nesting


def test_input_nested_100000_deep_is_a_400(client: Client) -> None:
    raw = b'{"model": "scripted-text", "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    error = client.error(None, 400, raw=raw)
    assert (error["code"], error["param"]) == ("json_too_deep", "input")
    assert "ORS_MAX_JSON_DEPTH" in error["message"]


def test_nesting_just_over_the_limit_is_a_400_and_at_the_limit_is_not(client: Client) -> None:
    # {"model", "input": [ {message, "content": [ {"type": "input_text", "text": ...} ]} ]}
    # is 4 deep; a tool's parameters add depth below "tools": [ {... "parameters": {...}} ].
    def nested(depth: int) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string"}
        for _ in range(depth):
            schema = {"type": "array", "items": schema}
        return schema

    over = {"model": "scripted-text", "input": "x",
            "tools": [_tool(parameters={"type": "object", "properties": {"a": nested(DEFAULT_MAX_JSON_DEPTH)}})]}
    error = client.error(over, 400)
    assert (error["code"], error["param"]) == ("json_too_deep", "tools")


def test_deep_frame_on_the_websocket_is_an_error_envelope(server: LiveServer) -> None:
    url = server.url.replace("http://", "ws://") + "/v1/responses"
    with connect(url, open_timeout=10) as ws:
        ws.send('{"type": "response.create", "model": "scripted-text", "input": ' + "[" * 50_000 + "]" * 50_000 + "}")
        envelope = json.loads(ws.recv(timeout=30))
        validate_ws_error(envelope)
        assert (envelope["error"]["code"], envelope["error"]["param"]) == ("json_too_deep", "input")
        # The connection stays usable.
        ws.send(json.dumps({"type": "response.create", "model": "scripted-text", "input": "hi", "store": False}))
        while (event := json.loads(ws.recv(timeout=30)))["type"] != "response.completed":
            assert event["type"] != "error", event


# ---------------------------------------------------------------- counts


def test_too_many_input_items(client: Client) -> None:
    items = [{"type": "message", "role": "user", "content": "x"}] * (DEFAULT_MAX_INPUT_ITEMS + 1)
    error = client.error({"model": "scripted-text", "input": items}, 400)
    assert (error["code"], error["param"]) == ("too_many_input_items", "input")


def _parts(count: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "a"}] * count}]


def test_a_body_of_too_many_values_is_a_400_and_one_just_under_is_served(client: Client) -> None:
    over = DEFAULT_MAX_JSON_VALUES // 3 + 1  # three values a part: its place, its type, its text
    error = client.error({"model": "scripted-text", "input": _parts(over)}, 400)
    assert (error["code"], error["param"]) == ("too_many_json_values", "input")
    under = (DEFAULT_MAX_JSON_VALUES - 100) // 3
    reply = client.http.post("/v1/responses", json={"model": "scripted-text", "input": _parts(under), "store": False})
    assert reply.status_code == 200, reply.text[:300]


def test_a_body_of_33_mb_of_small_values_is_a_400_and_a_large_text_comes_through_whole(client: Client) -> None:
    """Bodies over a mebibyte are decoded by a worker process (``engine/body_decoding.py``):
    the refusal is the same 400, and what is accepted arrives exactly as sent."""
    raw = json.dumps({"model": "scripted-text", "input": _parts(900_000)}).encode()
    assert len(raw) > 33_000_000
    error = client.error(None, 400, raw=raw)
    assert (error["code"], error["param"]) == ("too_many_json_values", "input")
    text = "Grüße, \"quoted\" \u2028 and commas, " * 150_000  # 5 MB
    response = client.create(model="scripted-text", input=text)
    items = client.http.get(f"/v1/responses/{response['id']}/input_items").json()["data"]
    assert items[0]["content"][0]["text"] == text


def test_a_frame_of_too_many_values_is_an_error_envelope_and_a_large_frame_is_served(
        server: LiveServer, client: Client) -> None:
    url = server.url.replace("http://", "ws://") + "/v1/responses"
    with connect(url, open_timeout=10, max_size=None) as ws:
        over = {"type": "response.create", "model": "scripted-text", "input": _parts(DEFAULT_MAX_JSON_VALUES // 3 + 1)}
        ws.send(json.dumps(over))
        envelope = json.loads(ws.recv(timeout=30))
        validate_ws_error(envelope)
        assert (envelope["error"]["code"], envelope["error"]["param"]) == ("too_many_json_values", "input")
        # a large frame that is valid is answered, and its text arrives whole
        text = "Grüße, \"quoted\", " * 150_000  # 3 MB, decoded by the worker process
        ws.send(json.dumps({"type": "response.create", "model": "scripted-text", "input": text}))
        while (event := json.loads(ws.recv(timeout=30)))["type"] != "response.completed":
            assert event["type"] != "error", event
        response_id = event["response"]["id"]
    items = client.http.get(f"/v1/responses/{response_id}/input_items").json()["data"]
    assert items[0]["content"][0]["text"] == text


def test_too_many_tools(client: Client) -> None:
    tools = [_tool(f"tool_{i}") for i in range(DEFAULT_MAX_TOOLS + 1)]
    error = client.error({"model": "scripted-text", "input": "x", "tools": tools}, 400)
    assert (error["code"], error["param"]) == ("too_many_tools", "tools")


def test_two_tools_of_one_name(client: Client) -> None:
    error = client.error({"model": "scripted-text", "input": "x", "tools": [_tool(), _tool("other"), _tool()]}, 400)
    assert (error["code"], error["param"]) == ("duplicate_tool_name", "tools[2].name")


def test_schema_over_the_byte_limit(client: Client) -> None:
    properties = {f"p{i:06d}": {"type": "string", "description": "d" * 100} for i in range(DEFAULT_MAX_SCHEMA_BYTES // 50)}
    big = _tool("big", parameters={"type": "object", "properties": properties})
    error = client.error({"model": "scripted-text", "input": "x", "tools": [_tool(), big]}, 400)
    assert (error["code"], error["param"]) == ("invalid_tool_schema", "tools[1].parameters")
    assert "ORS_MAX_SCHEMA_BYTES" in error["message"]


# ---------------------------------------------------------------- references are never fetched


@pytest.mark.parametrize("where", ["tool", "text.format"])
def test_remote_refs_are_refused_and_never_fetched(client: Client, where: str) -> None:
    with _counting_http_server() as (base, hits):
        for ref in (f"{base}/a.json", f"{base}/b.json#/x", "file:///etc/hostname"):
            schema = {"type": "object", "properties": {"code": {"$ref": ref}}}
            if where == "tool":
                body = {"model": "scripted-text", "input": "x", "tools": [_tool(parameters=schema)]}
                expected = ("invalid_tool_schema", "tools[0].parameters")
            else:
                body = {"model": "scripted-text", "input": "x",
                        "text": {"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}}}
                expected = ("invalid_json_schema", "text.format.schema")
            error = client.error(body, 400)
            assert (error["code"], error["param"]) == expected
            assert ref in error["message"]
        assert hits == []


def test_local_refs_still_work_in_text_format(client: Client) -> None:
    schema = {"$defs": {"greeting": {"type": "string"}}, "type": "object",
              "properties": {"g": {"$ref": "#/$defs/greeting"}}}
    response = client.create(model="scripted-text", input="x",
                             text={"format": {"type": "json_schema", "name": "out", "schema": schema}})
    assert response["status"] == "completed"


# ---------------------------------------------------------------- patterns run in linear time


def test_catastrophic_pattern_in_a_replayed_call_is_answered_at_once(client: Client) -> None:
    # With Python's backtracking `re` this request would hold the server for longer than
    # the age of the universe; pytest-timeout fails the test if it hangs.
    tool = _tool(parameters={"type": "object", "properties": {"code": {"type": "string", "pattern": EVIL_PATTERN}}})
    items = [
        {"type": "message", "role": "user", "content": "look it up"},
        {"type": "function_call", "call_id": "call_1", "name": "lookup",
         "arguments": json.dumps({"code": "a" * 5000 + "!"})},
        {"type": "function_call_output", "call_id": "call_1", "output": "found"},
    ]
    error = client.error({"model": "scripted-text", "input": items, "tools": [tool]}, 400)
    assert (error["code"], error["param"]) == ("arguments_schema", "input[2]")
    assert "does not match" in error["message"]


def test_catastrophic_pattern_in_a_strict_output_check_fails_the_response_at_once(client: Client) -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": EVIL_PATTERN}},
              "required": ["code"], "additionalProperties": False}
    stream = client.stream(model="scripted-redos", input="x",
                           text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}})
    assert stream.types()[-1] == "response.failed"
    assert stream.final["error"]["code"] == "output_schema_mismatch"


def test_lookaround_pattern_is_refused_with_a_reason(client: Client) -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(?!x)"}}}
    error = client.error({"model": "scripted-text", "input": "x",
                          "text": {"format": {"type": "json_schema", "name": "out", "schema": schema}}}, 400)
    assert (error["code"], error["param"]) == ("invalid_json_schema", "text.format.schema")
    assert "linear time" in error["message"]


# ------------------------------------ counts no grammar can hold (the embedded engine)

HUGE_COUNTS = [
    {"type": "string", "maxLength": 1_000_000_000},  # a grammar of gigabytes, before
    {"type": "string", "maxLength": 30_000},  # llama.cpp's parser overflowed its stack, before
    {"type": "string", "pattern": "^a{0,100000}$"},  # refused by RE2 at admission already
    {"type": "array", "items": {"type": "string"}, "minItems": 5_000},
]


@pytest.mark.parametrize("count", HUGE_COUNTS, ids=["maxLength-1e9", "maxLength-3e4", "pattern", "minItems"])
def test_a_forced_call_whose_schema_counts_too_far_is_a_400_and_the_server_lives(
    client: Client, count: dict[str, Any]
) -> None:
    schema = {"type": "object", "properties": {"a": count}}
    body = {"model": SMOL, "input": "x", "tools": [_tool(), _tool("counted", schema)], "tool_choice": "required"}
    error = client.error(body, 400)
    assert error["param"] == "tools[1].parameters"
    assert "at most 1,000" in error["message"] or "repetition size" in error["message"]
    assert client.create(model=SMOL, input="Say hi.", max_output_tokens=16)["status"] in ("completed", "incomplete")


def test_a_strict_format_that_counts_too_far_is_a_400(client: Client) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 50_000}}}
    error = client.error({"model": SMOL, "input": "x",
                          "text": {"format": {"type": "json_schema", "name": "out", "schema": schema}}}, 400)
    assert error["param"] == "text.format.schema"
    assert "maxLength asks for 50,000 repetitions" in error["message"]


def test_counts_add_up_across_the_tools_of_one_grammar(client: Client) -> None:
    within = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 1_000} for i in range(40)}}
    tools = [_tool(f"t{n}", within) for n in range(3)]  # 40,000 each: the third passes 100,000
    error = client.error({"model": SMOL, "input": "x", "tools": tools, "tool_choice": "required"}, 400)
    assert error["param"] == "tools[2].parameters"
    assert "add up to 120,000" in error["message"]


def test_counts_within_the_limit_still_make_a_grammar(client: Client) -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "maxLength": 12, "pattern": "^[A-Z]{3}$"}},
              "required": ["code"]}
    response = client.create(model=SMOL, input="Give a code.", tools=[_tool("lookup", schema)],
                             tool_choice="required", max_output_tokens=64)
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert calls and calls[0]["name"] == "lookup"
    assert len(json.loads(calls[0]["arguments"])["code"]) == 3


# ------------------------------------------- lone surrogates (valid JSON, not Unicode)

LONE = b"a \\ud800 b \\udc80"  # the JSON escapes of two lone surrogates


def test_a_lone_surrogate_is_read_as_a_replacement_character(client: Client) -> None:
    raw = b'{"model": "%s", "input": "Say hi. %s", "max_output_tokens": 16}' % (SMOL.encode(), LONE)
    reply = client.http.post("/v1/responses", content=raw, headers={"Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    response = reply.json()
    assert response["status"] in ("completed", "incomplete")
    stored = client.http.get(f"/v1/responses/{response['id']}/input_items").json()["data"]
    assert stored[0]["content"][0]["text"] == "Say hi. a \ufffd b \ufffd"  # as a TextEncoder reads it


def test_a_lone_surrogate_in_a_stream_and_a_grammar(client: Client) -> None:
    schema = b'{"type": "object", "properties": {"a": {"enum": ["x %s"]}}, "required": ["a"]}' % LONE
    raw = (b'{"model": "%s", "input": "%s", "max_output_tokens": 24, "stream": true, '
           b'"text": {"format": {"type": "json_schema", "name": "out", "strict": true, "schema": %s}}}'
           % (SMOL.encode(), LONE, schema))
    with client.http.stream("POST", "/v1/responses", content=raw, headers={"Content-Type": "application/json"}) as reply:
        assert reply.status_code == 200
        body = reply.read().decode()
    terminal = [line for line in body.splitlines() if line.startswith("event: response.")][-1]
    assert terminal in ("event: response.completed", "event: response.incomplete"), body[-500:]


# ------------------------------------------- what Python's JSON reader takes and JSON is not

NOT_JSON = {
    "an encoded surrogate": (b'"input": "a \xed\xa0\x80 b"', "not valid UTF-8"),
    "NaN": (b'"input": "hi", "temperature": NaN', "NaN is not a JSON number"),
    "-Infinity in a schema": (b'"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": '
                              b'{"type": "object", "properties": {"n": {"type": "number", "minimum": -Infinity}}}}]',
                              "-Infinity is not a JSON number"),
    "a number beyond a double": (b'"input": "hi", "temperature": 1e400', "1e400 is beyond the range of a double"),
    "an integer of 5,000 digits": (b'"input": "hi", "max_output_tokens": ' + b"9" * 5000, "more than 4,300 digits"),
}


@pytest.mark.parametrize("name", list(NOT_JSON))
def test_what_only_python_reads_as_json_is_a_400_and_the_connection_lives(client: Client, name: str) -> None:
    fields, says = NOT_JSON[name]
    raw = b'{"model": "scripted-text", ' + fields + b"}"
    error = client.error(None, 400, raw=raw)
    assert error["code"] == "invalid_json" and says in error["message"], error
    # the same kept-alive connection still serves: nothing failed inside the server
    assert client.http.post("/v1/responses", json={"model": "scripted-text", "input": "hi"}).status_code == 200


def test_a_websocket_frame_with_nan_is_an_error_envelope(server: LiveServer) -> None:
    url = server.url.replace("http://", "ws://") + "/v1/responses"
    with connect(url, open_timeout=10) as ws:
        ws.send('{"type": "response.create", "model": "scripted-text", "input": "hi", "temperature": NaN}')
        envelope = json.loads(ws.recv(timeout=10))
        validate_ws_error(envelope)
        assert envelope["error"]["code"] == "invalid_json", envelope


@pytest.mark.parametrize("value", [5, {"a": 1}, True, 1.5])
def test_input_of_the_wrong_type_is_a_400(client: Client, value: Any) -> None:
    error = client.error({"model": "scripted-text", "input": value}, 400)
    assert error["param"] == "input"


@pytest.mark.parametrize(("item", "param"), [
    ({"type": [1, 2], "role": "user", "content": "hi"}, "input[0].type"),
    ({"type": {"a": 1}, "call_id": "c", "output": "o"}, "input[0].type"),
    ({"role": ["user"], "content": "hi"}, "input[0].role"),
    ({"type": "message", "role": {"name": "user"}, "content": "hi"}, "input[0].role"),
    ({"role": 2**70, "content": "hi"}, "input[0].role"),
])
def test_an_item_whose_type_or_role_is_a_list_or_an_object_is_a_400(client: Client, item: dict[str, Any],
                                                                    param: str) -> None:
    # once a 500 that also dropped the kept-alive connection (the tag was looked up as a key)
    error = client.error({"model": "scripted-text", "input": [item]}, 400)
    assert error["param"] == param, error
    assert client.http.post("/v1/responses", json={"model": "scripted-text", "input": "hi"}).status_code == 200


def test_an_error_repeats_at_most_a_little_of_a_huge_value(client: Client) -> None:
    error = client.error({"model": "scripted-text", "input": [{"type": "z" * 70_000, "text": "hi"}]}, 400)
    assert error["param"] == "input[0].type"
    assert "zzz" in error["message"] and len(error["message"]) < 300, len(error["message"])
