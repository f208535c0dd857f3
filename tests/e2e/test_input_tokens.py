"""``POST /v1/responses/input_tokens`` on the real server: the count is the
``usage.input_tokens`` the same request reports when it runs (the embedded model's own
tokenizer and template, instructions, tools and ``previous_response_id`` chain
included); a request that would be refused is refused the same way; an upstream's model
cannot be counted here and says so."""

from __future__ import annotations

from typing import Any

import pytest

from tests.client import Client
from tests.conftest import SMOL

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def count(client: Client, body: dict[str, Any]) -> int:
    reply = client.http.post("/v1/responses/input_tokens", json=body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["object"] == "response.input_tokens" and set(answer) == {"object", "input_tokens"}
    assert isinstance(answer["input_tokens"], int) and answer["input_tokens"] > 0
    return answer["input_tokens"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("body", [
    {"input": "Say hi."},
    {"instructions": "Answer in French.", "input": "What is the weather in Paris?", "tools": [WEATHER]},
    {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "One"}]},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Two"}]},
               {"type": "message", "role": "user", "content": "Three?"}]},
])
def test_the_count_is_what_the_request_reports_when_it_runs(client: Client, body: dict[str, Any]) -> None:
    body = {"model": SMOL, **body}
    counted = count(client, body)
    ran = client.create(**body, max_output_tokens=16)
    assert ran["usage"]["input_tokens"] == counted


def test_a_continuation_counts_its_whole_chain(client: Client) -> None:
    first = client.create(model=SMOL, instructions="Be brief.", input="My code word is PELICAN.",
                          max_output_tokens=16)
    body = {"model": SMOL, "input": "What is my code word?", "previous_response_id": first["id"]}
    counted = count(client, body)
    assert counted > count(client, {"model": SMOL, "input": "What is my code word?"})
    assert client.create(**body, max_output_tokens=16)["usage"]["input_tokens"] == counted


def test_truncation_auto_counts_what_would_be_kept(client: Client) -> None:
    long = "the sea is wide and the sky is grey " * 300  # about 2,700 tokens a message
    turns = []
    for n in range(4):
        turns += [{"type": "message", "role": "user", "content": f"{n}: {long}"},
                  {"type": "message", "role": "assistant", "content": f"noted {n}"}]
    turns.append({"type": "message", "role": "user", "content": "Summarize."})
    whole = count(client, {"model": SMOL, "input": turns})  # longer than the window: counted all the same
    assert whole > 8192
    error = client.error({"model": SMOL, "input": turns, "max_output_tokens": 16}, 400)
    assert error["code"] == "context_length_exceeded"
    kept = count(client, {"model": SMOL, "input": turns, "truncation": "auto"})
    assert kept < 8192 < whole


def test_requests_that_would_be_refused_are_refused_the_same_way(client: Client) -> None:
    path = "/v1/responses/input_tokens"
    error = client.error({"model": SMOL, "input": 5}, 400, path=path)
    assert error["param"] == "input"
    error = client.error({"model": SMOL, "input": "x", "previous_response_id": "resp_nothing"}, 400, path=path)
    assert error["code"] == "previous_response_not_found"
    error = client.error({"model": "no-such-model", "input": "x"}, 404, path=path)
    assert error["code"] == "model_not_found"
    # a call answered twice: the replay gate's own reason
    answered_twice = [
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c1", "output": "rainy"},
    ]
    error = client.error({"model": SMOL, "input": answered_twice, "tools": [WEATHER]}, 400, path=path)
    assert error["param"] is not None and error["param"].startswith("input[")
    error = client.error({"model": SMOL, "input": "x"}, 400, path=path, raw=b"{not json")
    assert error["type"] == "invalid_request"


def test_a_model_run_upstream_cannot_be_counted_here(client: Client) -> None:
    error = client.error({"model": "scripted-text", "input": "hi"}, 400, path="/v1/responses/input_tokens")
    assert error["code"] == "unsupported_model" and error["param"] == "model"
