"""Mutated requests against the real server: whatever a field holds, the answer is a
response, a stream that ends with one terminal event, or a precise error object (400s
with their ``param``); never a server error.

Each case starts from a valid request that uses many features (messages with content
parts, tool calls and their outputs, reasoning, compaction, function, namespace and
custom tools, tool_choice variants, strict JSON output, logprobs, streaming) and changes
one to three values: to another JSON type, an edge number, a long or odd string, an
empty or nested container; or it drops a field or adds an unknown one. The seed is
fixed, so a failure names a case that fails again. A model error (the scripted model
ignoring a forced tool or a strict format) is a fair answer; a server error is not.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from compliance import SSEParser, StreamChecker, check_response, validate_error_body
from tests.client import Client

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer", "minimum": 0}},
          "required": ["city", "n"], "additionalProperties": False}
TOOL = {"type": "function", "name": "get_weather", "description": "w", "parameters": SCHEMA, "strict": True}

BASES: list[dict[str, Any]] = [
    {"model": "scripted-text", "input": "Hi"},
    {"model": "scripted-text", "instructions": "be brief", "temperature": 0.5, "top_p": 0.9,
     "max_output_tokens": 50, "metadata": {"a": "b"}, "store": True,
     "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                           {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=",
                                            "detail": "auto"}]}]},
    {"model": "scripted-tool", "tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"},
     "parallel_tool_calls": False, "max_tool_calls": 3,
     "input": [{"type": "message", "role": "user", "content": "weather?"},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                "arguments": '{"city": "Paris", "n": 1}'},
               {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]},
    {"model": "scripted-text", "input": "json please", "top_logprobs": 2, "truncation": "auto",
     "text": {"format": {"type": "json_schema", "name": "out", "schema": SCHEMA, "strict": True}, "verbosity": "low"},
     "reasoning": {"effort": "low", "summary": "auto"}, "include": ["message.output_text.logprobs"]},
    {"model": "scripted-reasoning", "input": "stream", "stream": True, "stream_options": {"include_obfuscation": False}},
    {"model": "scripted-text",
     "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]},
     "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}],
     "input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}], "encrypted_content": None},
               {"type": "message", "role": "assistant", "status": "completed", "id": "msg_1",
                "content": [{"type": "output_text", "text": "x", "annotations": []}]},
               {"role": "developer", "content": "d"}, {"role": "system", "content": "s"}]},
    {"model": "scripted-custom-tool", "stream": True, "tool_choice": "required", "user": "u",
     "safety_identifier": "s", "prompt_cache_key": "k", "service_tier": "auto", "presence_penalty": 0.5,
     "frequency_penalty": -0.5,
     "tools": [{"type": "namespace", "name": "ns", "description": "d",
                "tools": [{"type": "function", "name": "g",
                           "parameters": {"type": "object", "properties": {"q": {"type": "string", "pattern": "^a+$"}}}}]},
               {"type": "custom", "name": "apply", "description": "d",
                "format": {"type": "grammar", "syntax": "regex", "definition": "^[a-z]+$"}},
               {"type": "web_search"}],
     "input": [{"type": "message", "role": "user",
                "content": [{"type": "input_file", "filename": "a.txt", "file_data": "data:text/plain;base64,aGk="}]},
               {"type": "custom_tool_call", "call_id": "c2", "name": "apply", "input": "x"},
               {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "ok"}]},
               {"type": "item_reference", "id": "msg_zz"}]},
    {"model": "scripted-text", "input": [{"type": "compaction", "encrypted_content": "abc"},
                                         {"role": "user", "content": "hi"}],
     "text": {"format": {"type": "json_object"}}, "tool_choice": "none", "truncation": "disabled"},
]

VALUES: list[Any] = [None, True, False, 0, -1, 1.5, 1e308, 2**70, -(2**70), "", "x", "\u0000", "\u00e9\u2028",
                     "a" * 70_000, [], {}, [None], [1, 2], {"type": "x"}, {"a": {"b": [1]}}, "NaN"]
CASES = 600
SEED = 20261205


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _paths(inner, (*prefix, index))


def _mutated(chance: random.Random) -> dict[str, Any]:
    body = copy.deepcopy(chance.choice(BASES))
    for _ in range(chance.choice((1, 1, 1, 2, 3))):
        paths = [path for path in _paths(body) if path and path != ("model",)]
        if not paths:
            break
        path = chance.choice(paths)
        holder: Any = body
        for step in path[:-1]:
            holder = holder[step]
        roll = chance.random()
        if roll < 0.15:
            del holder[path[-1]]
        elif roll < 0.25 and isinstance(holder, dict):
            holder["unknown_field"] = copy.deepcopy(chance.choice(VALUES))
        else:
            holder[path[-1]] = copy.deepcopy(chance.choice(VALUES))
    return body


def _cases() -> list[dict[str, Any]]:
    chance = random.Random(SEED)
    return [_mutated(chance) for _ in range(CASES)]


def _check_stream(client: Client, body: dict[str, Any]) -> bool:
    """Whether the stream was answered (else refused)."""
    parser = SSEParser(require_done=True)
    checker = StreamChecker(transport="sse")
    with client.http.stream("POST", "/v1/responses", json=body) as reply:
        if reply.status_code != 200:
            reply.read()
            _check_refusal(reply.status_code, reply.json(), body)
            return False
        for chunk in reply.iter_raw():
            for event in parser.feed(chunk):
                checker.feed(event)
    parser.close()  # the stream ends with [DONE], no partial line
    failure = checker.finish().get("error") or {}
    assert failure.get("type", "model_error") == "model_error", (failure, json.dumps(body)[:600])
    return True


def _check_refusal(status: int, payload: Any, body: dict[str, Any]) -> None:
    shown = json.dumps(body)[:600]
    validate_error_body(payload)
    error = payload["error"]
    if status >= 500:
        assert error["type"] == "model_error", f"{status} {error} for {shown}"
    else:
        assert 400 <= status < 500, f"{status} {error} for {shown}"
        if status == 400:
            assert "param" in error, f"{error} for {shown}"


def test_no_mutation_of_a_valid_request_is_a_server_error(client: Client) -> None:
    answered = refused = 0
    for body in _cases():
        if body.get("stream") is True and not body.get("background"):
            if _check_stream(client, body):
                answered += 1
            else:
                refused += 1
            continue
        reply = client.http.post("/v1/responses", json=body)
        if reply.status_code == 200:
            answered += 1
            if reply.headers["content-type"].startswith("application/json"):
                check_response(reply.json())
        else:
            refused += 1
            _check_refusal(reply.status_code, reply.json(), body)
    # the cases reach past validation as well as into it
    assert answered > CASES // 20 and refused > CASES // 2, (answered, refused)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_websocket_turn_for_each_mutation_ends_in_a_response_or_an_error(client: Client, seed: int) -> None:
    from websockets.sync.client import connect

    from compliance import validate_ws_error

    chance = random.Random(SEED + seed)
    url = client.http.base_url.copy_with(scheme="ws").join("/v1/responses")
    with connect(str(url), open_timeout=10) as ws:
        for _ in range(150):
            body = _mutated(chance)
            body.pop("stream", None)
            body.pop("background", None)
            ws.send(json.dumps({"type": "response.create", **body}))
            while True:
                event = json.loads(ws.recv(timeout=30))
                if event["type"] == "error":
                    validate_ws_error(event)
                    assert event["error"]["type"] != "server_error", (event, json.dumps(body)[:600])
                    break
                if event["type"] in ("response.completed", "response.failed", "response.incomplete"):
                    failure = event["response"].get("error") or {}
                    assert failure.get("type", "model_error") == "model_error", (failure, json.dumps(body)[:600])
                    break
