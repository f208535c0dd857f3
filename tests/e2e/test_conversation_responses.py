"""Responses in a conversation (``conversation`` on ``POST /v1/responses``) over real
HTTP and WebSocket, on both store engines, with the embedded SmolLM2: the conversation's
items are the model's context, each response's input and output are appended to it,
one response runs on it at a time, and the replay gate checks answers against its calls.
The OpenAI Agents SDK's conversation session drives it as its users do. The scripted
backend (named as such) makes the calls the gate cases need."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from app.backends.local import LocalBackend
from app.config import Settings
from app.main import create_app
from compliance import check_response, validate_error_body
from tests.conftest import SMOL, scripted_backend
from tests.live import LiveServer
from tests.recording import RecordingBackend
from tests.ws_client import MuxSocket

KEY = "conv-key"


@dataclass
class Served:
    server: LiveServer
    model: RecordingBackend
    client: OpenAI

    def prompt_text(self, request: int = -1) -> str:
        """Everything the model was given in one request, as text."""
        return json.dumps([message.content for message in self.model.requests[request].messages], default=str)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request: pytest.FixtureRequest, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    database_url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    settings = Settings(default_model=SMOL, data_dir=tmp_path_factory.mktemp(f"conv-responses-{request.param}"),
                        database_url=database_url, api_keys=[KEY])
    model = RecordingBackend(LocalBackend(model_dir, n_threads=2, n_ctx=4096, preload=[SMOL], models=[SMOL]))
    server = LiveServer(create_app(settings, backends=[model, scripted_backend()])).start()
    client = OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    yield Served(server, model, client)
    server.stop()


def post(served: Served, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{served.server.url}/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=300)


def error_of(reply: httpx.Response, status: int) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    validate_error_body(reply.json())
    return reply.json()["error"]  # type: ignore[no-any-return]


def test_each_turn_sees_the_conversation_and_is_added_to_it(served: Served) -> None:
    client = served.client
    conversation = client.conversations.create(items=[
        {"type": "message", "role": "developer", "content": "Answer in one short sentence."}])
    raw = client.responses.with_raw_response.create(model=SMOL, conversation=conversation.id, max_output_tokens=32,
                                                    input="My secret code word is PELICAN.")
    check_response(raw.http_response.json())
    first = raw.parse()
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [item.type for item in items] == ["message"] * 3
    assert items[1].content[0].text == "My secret code word is PELICAN."
    assert items[2].id == first.output[0].id and items[2].content[0].text == first.output_text
    second = client.responses.create(model=SMOL, conversation={"id": conversation.id}, max_output_tokens=32,
                                     input="What is my secret code word?")
    seen = served.prompt_text()
    assert "Answer in one short sentence." in seen and "PELICAN" in seen and first.output_text.strip()[:20] in seen
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [item.id for item in items[-2:]][1] == second.output[0].id and len(items) == 5


def test_conversation_is_checked_before_the_model_is_called(served: Served) -> None:
    conversation = served.client.conversations.create()
    calls = len(served.model.requests)
    previous = served.client.responses.create(model=SMOL, input="Hi", max_output_tokens=16)
    for body, status, param, code in (
        ({"conversation": conversation.id, "previous_response_id": previous.id}, 400, "conversation", None),
        ({"conversation": conversation.id, "store": False}, 400, "store", None),
        ({"conversation": ""}, 400, "conversation", None),
        ({"conversation": {"id": 7}}, 400, "conversation", None),
        ({"conversation": "conv_absent"}, 404, "conversation", "conversation_not_found"),
    ):
        error = error_of(post(served, {"model": SMOL, "input": "Hi", **body}), status)
        assert error["param"] == param and (code is None or error["code"] == code), error
    assert len(served.model.requests) == calls + 1  # only the plain response reached the model
    assert served.client.conversations.items.list(conversation.id).data == []


def test_one_response_runs_on_a_conversation_at_a_time(served: Served) -> None:
    conversation = served.client.conversations.create()
    body = {"model": SMOL, "conversation": conversation.id, "input": "Write a long story about a fox.",
            "max_output_tokens": 400, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{served.server.url}/v1/responses", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=300) as running:
        lines = running.iter_lines()
        assert next(line for line in lines if line.startswith("data: ")).startswith('data: {"type":"response.created"')
        busy = error_of(post(served, {"model": SMOL, "conversation": conversation.id, "input": "Hi",
                                      "max_output_tokens": 16}), 409)
        assert busy["code"] == "conversation_busy" and busy["param"] == "conversation"
        for _ in lines:  # the first runs to its end
            pass
    after = post(served, {"model": SMOL, "conversation": conversation.id, "input": "Hi", "max_output_tokens": 16})
    assert after.status_code == 200, after.text
    assert len(served.client.conversations.items.list(conversation.id).data) == 4


def test_the_replay_gate_checks_answers_against_the_conversations_calls(served: Served) -> None:
    conversation = served.client.conversations.create(items=[
        {"type": "message", "role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": "call_paris", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    ])
    tools = [{"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    unknown = error_of(post(served, {"model": "scripted-text", "conversation": conversation.id, "tools": tools,
                                     "input": [{"type": "function_call_output", "call_id": "call_nowhere",
                                                "output": "18 C"}]}), 400)
    assert unknown["param"] == "input[0]" and unknown["code"] == "call_id", unknown
    answered = post(served, {"model": "scripted-text", "conversation": conversation.id, "tools": tools,
                             "input": [{"type": "function_call_output", "call_id": "call_paris", "output": "18 C"}]})
    assert answered.status_code == 200, answered.text
    kinds = [item.type for item in served.client.conversations.items.list(conversation.id, order="asc").data]
    assert kinds == ["message", "function_call", "function_call_output", "message"]


def test_after_a_compaction_turn_the_model_starts_from_its_summary(served: Served) -> None:
    said = "The marker of this test is KIWI-7."
    conversation = served.client.conversations.create(items=[
        {"type": "message", "role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": said},
        {"type": "message", "role": "assistant", "content": "Noted."}])
    compacted = post(served, {"model": SMOL, "conversation": conversation.id, "max_output_tokens": 64,
                              "input": [{"type": "compaction_trigger"}]})
    assert compacted.status_code == 200, compacted.text
    [summary] = compacted.json()["output"]
    assert summary["type"] == "compaction"
    items = served.client.conversations.items.list(conversation.id, order="asc").data
    assert [item.type for item in items] == ["message", "message", "message", "compaction"]  # the trigger is not kept
    after = post(served, {"model": SMOL, "conversation": conversation.id, "input": "Go on.", "max_output_tokens": 16})
    assert after.status_code == 200, after.text
    messages = served.model.requests[-1].messages
    assert not any(message.role == "user" and said in str(message.content) for message in messages)
    assert any(message.role in ("system", "developer") and "Be brief." in str(message.content) for message in messages)
    assert any(message.role == "user" and "Go on." in str(message.content) for message in messages)


def test_a_turn_over_the_websocket_is_added_too(served: Served) -> None:
    conversation = served.client.conversations.create()
    socket = MuxSocket(served.server.url.replace("http://", "ws://") + "/v1/responses",
                       headers={"Authorization": f"Bearer {KEY}"})
    try:
        socket.send(model=SMOL, conversation=conversation.id, input="Hello there!", max_output_tokens=16)
        [turn] = socket.turns(1)
    finally:
        socket.close()
    assert turn.final["status"] in ("completed", "incomplete")
    items = served.client.conversations.items.list(conversation.id, order="asc").data
    assert [item.role for item in items] == ["user", "assistant"] and items[1].id == turn.final["output"][0]["id"]


def test_the_agents_sdk_keeps_its_session_in_a_conversation(served: Served) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
    from agents.memory import OpenAIConversationsSession
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    async def two_turns() -> tuple[str, list[Any]]:
        client = AsyncOpenAI(base_url=f"{served.server.url}/v1", api_key=KEY, max_retries=0)
        session = OpenAIConversationsSession(openai_client=client)
        # greedy, so the small model's answers are the same every run (and end well before the budget)
        agent = Agent(name="notes", instructions="Answer in one short sentence.",
                      model=OpenAIResponsesModel(model=SMOL, openai_client=client),
                      model_settings=ModelSettings(temperature=0, max_tokens=256))
        await Runner.run(agent, "Remember: my favourite colour is teal.", session=session)
        await Runner.run(agent, "What is my favourite colour?", session=session)
        items = await session.get_items()
        await client.close()
        return session.session_id, items

    conversation_id, items = asyncio.run(two_turns())
    assert conversation_id.startswith("conv_")
    assert [item.get("role") for item in items] == ["user", "assistant", "user", "assistant"]
    assert "teal" in served.prompt_text()  # the second turn's request held the first
