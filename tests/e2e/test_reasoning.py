"""Reasoning from an upstream that streams ``reasoning_content`` (a small scripted
Chat Completions server on loopback, named as such: no real reasoning model runs here),
and its encrypted round trip."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from app.backends.chat_completions import ChatCompletionsBackend
from app.config import Settings
from app.main import create_app
from tests.client import Client, output_text
from tests.live import LiveServer
from tests.upstream_server import DONE, ScriptedUpstream, chunk, running_scripted_upstream

THOUGHT = "The user greets me; a short friendly answer fits."


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with running_scripted_upstream() as scripted:
        yield scripted


@pytest.fixture(scope="module")
def client(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    backend = ChatCompletionsBackend(upstream.base_url, replay_reasoning=True)
    settings = Settings(data_dir=tmp_path_factory.mktemp("reasoning"), default_model="smollm2-135m-instruct")
    server = LiveServer(create_app(settings, backends=[backend])).start()
    client = Client(server.url)
    yield client
    client.close()
    server.stop()


def _thinking_model(upstream: ScriptedUpstream) -> str:
    return upstream.stream(
        chunk(reasoning_content="The user greets me; "),
        chunk(reasoning_content="a short friendly answer fits."),
        chunk(content="Hello"),
        chunk(content="!", finish_reason="stop"),
        DONE,
    )


def test_reasoning_becomes_a_reasoning_item(client: Client, upstream: ScriptedUpstream) -> None:
    result = client.stream(model=_thinking_model(upstream), input="hi")
    kinds = [item["type"] for item in result.final["output"]]
    assert kinds == ["reasoning", "message"]
    assert result.final["output"][0]["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    assert "response.reasoning.delta" in result.types()
    assert result.text() == "Hello!"  # reasoning never leaks into output_text
    assert "encrypted_content" not in result.final["output"][0]


def test_encrypted_reasoning_round_trip(client: Client, upstream: ScriptedUpstream) -> None:
    first = client.create(model=_thinking_model(upstream), input="hi", store=False,
                          include=["reasoning.encrypted_content"])
    reasoning = first["output"][0]
    sealed = reasoning["encrypted_content"]
    assert sealed and "friendly" not in sealed  # really encrypted
    follow_up = upstream.stream(chunk(content="Fine.", finish_reason="stop"), DONE)
    client.create(model=follow_up, store=False, input=[
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": reasoning["id"], "summary": [], "encrypted_content": sealed},
        first["output"][1],
        {"role": "user", "content": "and now?"},
    ])
    sent = upstream.requests_for(follow_up)[-1].body["messages"]
    assistant = next(message for message in sent if message["role"] == "assistant")
    assert assistant["reasoning_content"] == THOUGHT
    assert assistant["content"] == "Hello!"


def test_foreign_reasoning_blob_is_dropped_not_fatal(
    client: Client, upstream: ScriptedUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ors.context")
    model = upstream.stream(chunk(content="ok", finish_reason="stop"), DONE)
    response = client.create(model=model, store=False, input=[
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_foreign", "summary": [], "encrypted_content": "gAAAAABforeign-provider-blob"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ])
    assert output_text(response) == "ok"
    sent = upstream.requests_for(model)[-1].body["messages"]
    assert all("reasoning_content" not in message for message in sent)
    assert "rs_foreign" in caplog.text


def test_reasoning_effort_reaches_the_upstream(client: Client, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(chunk(content="ok", finish_reason="stop"), DONE)
    response = client.create(model=model, input="x", reasoning={"effort": "high"})
    assert response["reasoning"] == {"effort": "high", "summary": None}
    assert upstream.requests_for(model)[-1].body["reasoning_effort"] == "high"




def test_phase_is_forwarded_to_the_upstream(client: Client, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(chunk(content="ok", finish_reason="stop"), DONE)
    response = client.create(model=model, input=[
        {"role": "user", "content": "plan it"},
        {"role": "assistant", "content": "Planning first.", "phase": "commentary"},
        {"role": "assistant", "content": "Done.", "phase": "final_answer"},
        {"role": "user", "content": "thanks"},
    ])
    sent = upstream.requests_for(model)[-1].body["messages"]
    assert [m.get("phase") for m in sent if m["role"] == "assistant"] == ["commentary", "final_answer"]
    items = client.http.get(f"/v1/responses/{response['id']}/input_items", params={"order": "asc"}).json()["data"]
    assert [item.get("phase") for item in items] == [None, "commentary", "final_answer", None]
