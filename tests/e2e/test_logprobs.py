"""``include: ["message.output_text.logprobs"]`` (and ``top_logprobs``) over real HTTP,
against the embedded SmolLM2 model; every response and event is checked against the spec
by ``tests.client``. The upstream adapter's logprobs are in ``test_upstream.py``."""

from __future__ import annotations

from typing import Any

from compliance import check_response
from tests.client import Client
from tests.conftest import SMOL

LOGPROBS = "message.output_text.logprobs"
PROMPT = "Name three colors, separated by commas."


def output_text_parts(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        part
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    ]


def check_logprobs(text: str, logprobs: list[dict[str, Any]], top: int) -> None:
    """One entry per token of ``text``: the tokens spell the text, their bytes spell its
    UTF-8, logprobs are ≤ 0, and each has ``top`` alternatives, most likely first."""
    assert "".join(lp["token"] for lp in logprobs) == text
    assert b"".join(bytes(lp["bytes"]) for lp in logprobs) == text.encode("utf-8")
    for lp in logprobs:
        assert lp["logprob"] <= 0
        try:
            whole = bytes(lp["bytes"]).decode("utf-8")
        except UnicodeDecodeError:
            whole = None  # a token that cuts a multi-byte character: its text is what it completed
        if whole is not None:
            assert lp["token"] == whole
        alternatives = [alternative["logprob"] for alternative in lp["top_logprobs"]]
        assert len(alternatives) == top
        assert alternatives == sorted(alternatives, reverse=True)
        assert all(value <= 0 for value in alternatives)


def keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {key for inner in value.values() for key in keys(inner)}
    if isinstance(value, list):
        return {key for inner in value for key in keys(inner)}
    return set()


def test_json_response_carries_logprobs_and_so_does_the_stored_one(client: Client) -> None:
    response = client.create(model=SMOL, input=PROMPT, include=[LOGPROBS], top_logprobs=3, max_output_tokens=24)
    parts = output_text_parts(response)
    assert parts and parts[0]["text"]
    for part in parts:
        check_logprobs(part["text"], part["logprobs"], top=3)
    stored = client.http.get(f"/v1/responses/{response['id']}")
    assert stored.status_code == 200
    assert check_response(stored.json())["output"] == response["output"]


def test_streamed_deltas_carry_the_logprobs_of_their_tokens(client: Client) -> None:
    result = client.stream(model=SMOL, input=PROMPT, include=[LOGPROBS], top_logprobs=3, max_output_tokens=24)
    deltas = [e for e in result.events if e["type"] == "response.output_text.delta"]
    assert deltas
    for delta in deltas:
        check_logprobs(delta["delta"], delta["logprobs"], top=3)
    streamed = [lp for delta in deltas for lp in delta["logprobs"]]
    [done] = [e for e in result.events if e["type"] == "response.output_text.done"]
    [part_done] = [e for e in result.events if e["type"] == "response.content_part.done"]
    assert done["logprobs"] == part_done["part"]["logprobs"] == streamed
    [part] = output_text_parts(result.final)
    assert part["logprobs"] == streamed
    check_logprobs(part["text"], part["logprobs"], top=3)


def test_top_logprobs_alone_asks_for_logprobs_and_include_alone_has_no_alternatives(client: Client) -> None:
    alternatives = client.create(model=SMOL, input=PROMPT, top_logprobs=2, max_output_tokens=16)
    for part in output_text_parts(alternatives):
        check_logprobs(part["text"], part["logprobs"], top=2)
    plain = client.create(model=SMOL, input=PROMPT, include=[LOGPROBS], max_output_tokens=16)
    for part in output_text_parts(plain):
        check_logprobs(part["text"], part["logprobs"], top=0)


def test_without_asking_there_are_no_logprobs_fields(client: Client) -> None:
    response = client.create(model=SMOL, input=PROMPT, max_output_tokens=16)
    assert output_text_parts(response) and "logprobs" not in keys(response)
    result = client.stream(model=SMOL, input=PROMPT, max_output_tokens=16, top_logprobs=0)
    assert "logprobs" not in keys(result.events)


def test_a_backend_without_logprobs_refuses_before_the_response_starts(client: Client) -> None:
    error = client.error({"model": "scripted-text", "input": "x", "include": [LOGPROBS]}, 400)
    assert error["param"] == "include" and "logprobs" in error["message"]
    error = client.error({"model": "scripted-text", "input": "x", "top_logprobs": 2, "stream": True}, 400)
    assert error["param"] == "include"
