"""Each model family's own chat format, through the real server. The GGUF files that
install here are given another family's chat template (the model authors' templates
that llama.cpp keeps for its own tests, installed by ``make`` from the pinned sources:
scripts/llama-templates.sh) and served as the operator's models; their server's own
parsers (``chat_parser`` ``auto``) read what the model writes, and a required call is
held to the family's syntax by that server's grammar, so even a small model writes it.
What comes back are typed items, checked against the spec. The calls are Qwen's (1.5B):
a family's grammar for a required call lets text come first, and SmolLM2 (135M) writes
text until its budget ends; SmolLM2 serves the reasoning test."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.backends.model_files import SMOLLM2, ModelFiles, locate
from app.config import Settings
from app.main import create_app
from compliance.schemas import validate_error_body, validate_response
from tests.conftest import QWEN
from tests.gguf_fixtures import with_template
from tests.live import LiveServer

pytestmark = pytest.mark.model

TEMPLATES = Path(sys.prefix) / "share" / "llama.cpp" / "templates"
"""Where ``make`` installs llama.cpp's templates of model families."""
FAMILIES = {
    # id: (the file it is made from, its family's template)
    "llama-3": ("qwen", "meta-llama-Llama-3.2-3B-Instruct.jinja"),
    "qwen3-coder": ("qwen", "Qwen3-Coder.jinja"),
    "r1-distill": ("smol", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"),
}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city now.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"type": "function", "name": "get_time", "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def families(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    assert (TEMPLATES / ".complete").is_file(), "make installs the templates (scripts/llama-templates.sh)"
    root = tmp_path_factory.mktemp("families")
    smol = locate(SMOLLM2.source.file)  # type: ignore[union-attr]
    assert smol is not None
    sources = {"smol": smol, "qwen": ModelFiles(model_dir).path(QWEN)}
    folder = root / "models"
    folder.mkdir()
    for model, (source, template) in FAMILIES.items():
        with_template(sources[source], folder / f"{model}.gguf", (TEMPLATES / template).read_text())
    settings = Settings(data_dir=root / "data", models_dir=folder, default_model="llama-3", model_threads=2,
                        model_parallel=1, model_context=4096)
    server = LiveServer(create_app(settings)).start()
    yield server
    server.stop()


def respond(server: LiveServer, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/responses", json={"max_output_tokens": 120, **body}, timeout=600)


def calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == "function_call"]


@pytest.mark.parametrize("model", ["llama-3", "qwen3-coder"])
def test_a_required_call_is_written_in_the_familys_syntax_and_read_back(families: LiveServer, model: str) -> None:
    reply = respond(families, model=model, input="What is the weather in Paris?", tools=[WEATHER, TIME],
                    tool_choice={"type": "function", "name": "get_time"}, parallel_tool_calls=False,
                    temperature=0)
    assert reply.status_code == 200, reply.text
    validate_response(reply.json())
    made = calls(reply.json())
    assert [call["name"] for call in made] == ["get_time"], reply.json()["output"]
    assert isinstance(json.loads(made[0]["arguments"])["city"], str)
    assert made[0]["status"] == "completed" and made[0]["call_id"]


def test_a_familys_answer_without_tools_is_a_message(families: LiveServer) -> None:
    reply = respond(families, model="llama-3", input="Say hello.", max_output_tokens=16, temperature=0)
    assert reply.status_code == 200, reply.text
    validate_response(reply.json())
    kinds = [item["type"] for item in reply.json()["output"]]
    assert kinds == ["message"], reply.json()["output"]
    assert "<|start_header_id|>" not in reply.json()["output"][0]["content"][0]["text"]


def test_think_reasoning_is_a_reasoning_item(families: LiveServer) -> None:
    reply = respond(families, model="r1-distill", input="Say hello.", max_output_tokens=24, temperature=0)
    assert reply.status_code == 200, reply.text
    validate_response(reply.json())
    reasoning = [item for item in reply.json()["output"] if item["type"] == "reasoning"]
    assert reasoning and reasoning[0]["content"][0]["type"] == "reasoning_text", reply.json()["output"]
    assert reasoning[0]["content"][0]["text"].strip()
    assert "<think>" not in json.dumps(reply.json()["output"])


def test_the_replay_gate_holds_a_familys_call(families: LiveServer) -> None:
    first = respond(families, model="llama-3", input="What is the weather in Paris?", tools=[WEATHER],
                    tool_choice="required", temperature=0).json()
    call = calls(first)[0]
    forged = respond(families, model="llama-3", previous_response_id=first["id"], tools=[WEATHER],
                     input=[{"type": "function_call_output", "call_id": "call_nobody_made", "output": "sunny"}])
    assert forged.status_code == 400, forged.text
    validate_error_body(forged.json())
    answered = respond(families, model="llama-3", previous_response_id=first["id"], tools=[WEATHER],
                       input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 21 C"}],
                       tool_choice="none", temperature=0, max_output_tokens=16)
    assert answered.status_code == 200, answered.text
    validate_response(answered.json())
