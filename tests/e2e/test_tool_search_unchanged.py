"""A request without deferred tools reaches every backend exactly as it did before tool
search existed: the same upstream request bodies, byte for byte (a Chat Completions and a
Responses upstream, scripted on loopback and named as such: they record what they are
sent), and the same backend-neutral request for the embedded engine, whose prompt is
rendered from it alone. The golden values below were recorded from the server as it was
before tool search was added; only the response-specific ids are masked."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.backends.base import GenerationRequest
from app.backends.model_files import LOCAL_MODELS, ModelFiles
from app.backends.scripted import ScriptedBackend, text_script
from app.backends.vocabulary import Vocabulary
from tests.client import Client
from tests.conftest import SMOL
from tests.live import serve_in_front
from tests.upstream_server import DONE, ScriptedUpstream, chunk, running_scripted_upstream

SHELL = {"type": "function", "name": "shell", "description": "Run a command.",
         "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
AGENTS = {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
    {"type": "function", "name": "spawn", "description": "Start one.",
     "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}},
    {"type": "function", "name": "wait", "description": "Wait for one.", "strict": False,
     "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}},
]}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch.", "format": {"type": "text"}}
CONVERSATION = [
    {"role": "user", "content": "List the files."},
    {"type": "function_call", "call_id": "call_a", "name": "shell", "arguments": '{"command": "ls"}'},
    {"type": "function_call_output", "call_id": "call_a", "output": "README.md\napp"},
    {"role": "user", "content": "Now start an agent."},
]
REQUEST = {"instructions": "Be brief.", "tools": [SHELL, AGENTS, PATCH], "input": CONVERSATION,
           "tool_choice": "auto", "temperature": 0.5, "prompt_cache_key": "golden"}

CHAT_SHA256 = "38594290a4c507437db6f0bbcf3598613da353d5ca749114a28e2d59acce555b"
RESPONSES_SHA256 = "413549664294d644517c91afb318f9356ae6eb8700ba3ec38ec8bad4e5b2100c"
EMBEDDED_SHA256 = "a00e08b1b865f3d1bef9aec7c5d091b64eed4881ec0adb2010fbfddd30ebd050"
PROMPT_SHA256 = "5f9162ea72e6e2c0683d2221f4ed0f7dd82c745936a9553d9ca9419fb125b654"


def _digest(value: Any) -> str:
    """Of the JSON as sent: its keys in the order they came."""
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()


SEEN: list[GenerationRequest] = []


def _record(request: GenerationRequest) -> list[Any]:
    SEEN.append(request)
    return text_script("ok")


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with running_scripted_upstream() as scripted:
        yield scripted


@pytest.fixture(scope="module")
def front(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    data: Path = tmp_path_factory.mktemp("unchanged")
    scripted = ScriptedBackend({"recorded": _record})
    server = serve_in_front(data, f"""
[upstreams.chat]
base_url = "{upstream.base_url}"
prefixes = ["chat/"]

[upstreams.responses]
base_url = "{upstream.base_url}"
wire_api = "responses"
prefixes = ["responses/"]
""", default_model="recorded", backends=[scripted])
    client = Client(server.url)
    yield client
    client.close()
    server.stop()


def test_a_chat_completions_upstream_is_sent_the_same_body(front: Client, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(chunk(content="ok", finish_reason="stop"), DONE, model="golden-chat")
    front.create(model=f"chat/{model}", **REQUEST)
    body = upstream.requests_for(model)[-1].body
    assert _digest(body) == CHAT_SHA256, json.dumps(body)


def test_a_responses_upstream_is_sent_the_same_body(front: Client, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(
        {"type": "response.output_item.done", "output_index": 0,
         "item": {"type": "message", "content": [{"type": "output_text", "text": "ok"}]}},
        {"type": "response.completed", "response": {"status": "completed"}},
        model="golden-responses",
    )
    front.create(model=f"responses/{model}", **REQUEST)
    body = upstream.requests_for(model)[-1].body
    assert _digest(body) == RESPONSES_SHA256, json.dumps(body)


def _as_before(request: GenerationRequest) -> dict[str, Any]:
    """The request as the fields that existed before tool search: what the embedded
    engine renders its prompt from (call ids masked: they are made per response)."""
    return {
        "model": request.model,
        "messages": [{"role": m.role, "content": m.content, "tool_call_id": m.tool_call_id,
                      "reasoning": m.reasoning, "phase": m.phase,
                      "tool_calls": [[c.call_id, c.name, c.arguments] for c in m.tool_calls]}
                     for m in request.messages],
        # a tool's ``grammar`` (a custom tool's Lark grammar) came later, for another reason
        "tools": [{k: v for k, v in dataclasses.asdict(tool).items() if k != "grammar"} for tool in request.tools],
        "tool_policy": dataclasses.asdict(request.tool_policy),
        "sampling": dataclasses.asdict(request.sampling),
        "output_format": dataclasses.asdict(request.output_format),
        "reasoning_effort": request.reasoning_effort,
        "cache_key": request.cache_key,
        "incremental": request.incremental,
    }


def test_the_embedded_engine_is_asked_the_same(front: Client) -> None:
    front.create(model="recorded", **REQUEST)
    assert _digest(_as_before(SEEN[-1])) == EMBEDDED_SHA256, json.dumps(_as_before(SEEN[-1]))
    # and nothing of tool search rides along: no loaded tools, no search, no search items
    assert (SEEN[-1].late_tools, SEEN[-1].tool_search) == ((), None)
    assert not any(m.loaded or any(c.tool_search for c in m.tool_calls) for m in SEEN[-1].messages)


@pytest.mark.model
def test_the_embedded_prompt_is_the_same(front: Client, model_dir: Path) -> None:
    """SmolLM2's chat template renders that request into the same prompt text."""
    front.create(model="recorded", **REQUEST)
    vocabulary = Vocabulary(LOCAL_MODELS[SMOL], ModelFiles(model_dir).path(SMOL))
    try:
        prompt = vocabulary.prompt(SEEN[-1].messages, SEEN[-1].tools)
    finally:
        vocabulary.close()
    assert hashlib.sha256(prompt.encode()).hexdigest() == PROMPT_SHA256, prompt
