"""Models an operator brings, served through the real server: the two models that install
here, under new ids, from a models folder (``ORS_MODELS_DIR``) and from ``[models.ID]``
entries of ``ORS_CONFIG``, beside files that cannot be served. ``ors serve`` builds the
app the same way (``create_app(settings)`` with no backends given)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.backends.model_files import SMOLLM2, ModelFiles, locate
from app.config import Settings
from app.main import create_app
from compliance.schemas import validate_error_body, validate_response
from tests.conftest import QWEN, SMOL
from tests.gguf_fixtures import write_gguf
from tests.live import LiveServer

pytestmark = pytest.mark.model

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n" + "This turn is rendered by the entry's own "
            "template, not by the one in the file. " * 8 + "{{ m.content }}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n")
"""A template of an entry's own, which says so at length in every turn (and so counts
more tokens than the file's own, with its default system prompt)."""


@pytest.fixture(scope="module")
def served(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("operator")
    smol = locate(SMOLLM2.source.file)  # type: ignore[union-attr]
    assert smol is not None
    qwen = ModelFiles(model_dir).path(QWEN)
    folder = root / "models"
    folder.mkdir()
    (folder / "tiny-chat.gguf").symlink_to(smol)
    (folder / "not-a-model.gguf").write_text("a text file given the wrong name\n")
    vision = folder / "smol-vision"
    vision.mkdir()
    (vision / "SmolLM2-135M-Instruct.Q4_1.gguf").symlink_to(smol)
    write_gguf(vision / "mmproj-F16.gguf", projector=True)
    config = root / "ors.toml"
    config.write_text(f"""
[models.coder]
path = "{qwen}"
context = 4096
parallel = 1
aliases = ["my-coder"]
temperature = 0.0
max_output_tokens = 12

[models.smol-templated]
path = "models/tiny-chat.gguf"
chat_template = '''{TEMPLATE}'''

[models.broken-template]
path = "models/tiny-chat.gguf"
chat_template = "{{% for m in messages %}}{{{{ m.content "
""")
    settings = Settings(data_dir=root / "data", models_dir=folder, config=config, default_model="tiny-chat",
                        model_threads=2, model_parallel=2)
    server = LiveServer(create_app(settings)).start()
    yield server
    server.stop()


def listed(server: LiveServer) -> dict[str, dict[str, Any]]:
    reply = httpx.get(f"{server.url}/v1/models", timeout=30)
    assert reply.status_code == 200, reply.text
    return {model["id"]: model for model in reply.json()["data"]}


def respond(server: LiveServer, model: str, text: str = "Say hello.", **fields: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/responses", timeout=600,
                      json={"model": model, "input": text, "max_output_tokens": 16, **fields})


def test_the_folder_and_the_entries_are_listed_with_their_windows_and_states(served: LiveServer) -> None:
    models = listed(served)
    assert {SMOL, QWEN, "tiny-chat", "smol-vision", "not-a-model", "coder", "my-coder", "smol-templated",
            "broken-template"} <= set(models)
    assert not any("mmproj" in model for model in models), "a projector is no model of its own"
    assert models["tiny-chat"]["status"] == "loaded", "the default model is loaded at start"
    assert models["not-a-model"]["status"] == "error"
    assert models["tiny-chat"]["context_window"] == 8192, "its trained window, read from the file"
    assert models["coder"]["context_window"] == models["my-coder"]["context_window"] == 4096


def test_a_folder_model_answers(served: LiveServer) -> None:
    for model in ("tiny-chat", "smol-vision"):
        reply = respond(served, model)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        validate_response(body)
        assert body["status"] in ("completed", "incomplete") and body["model"] == model
        assert body["output"][0]["content"][0]["text"]
    assert listed(served)["smol-vision"]["status"] == "loaded"


def test_an_entry_loads_on_its_first_request_with_its_own_settings(served: LiveServer) -> None:
    assert listed(served)["coder"]["status"] == "unloaded"
    first = respond(served, "my-coder", "Write a Python function that adds two numbers.", max_output_tokens=None)
    assert first.status_code == 200, first.text
    validate_response(first.json())
    assert first.json()["model"] == "my-coder"
    assert first.json()["usage"]["output_tokens"] <= 12, "the entry's max_output_tokens"
    assert listed(served)["coder"]["status"] == "loaded"
    again = respond(served, "coder", "Write a Python function that adds two numbers.", max_output_tokens=None)
    assert again.json()["output"] == first.json()["output"] or \
        again.json()["output"][0]["content"] == first.json()["output"][0]["content"], "temperature 0: greedy"
    long = respond(served, "coder", "word " * 5000)
    assert long.status_code == 400, long.text
    validate_error_body(long.json())
    assert long.json()["error"]["param"] == "input", "the entry's window of 4,096 tokens"


def test_an_entry_renders_with_its_own_template(served: LiveServer) -> None:
    counts = {}
    for model in ("tiny-chat", "smol-templated"):
        reply = httpx.post(f"{served.url}/v1/responses/input_tokens", timeout=600,
                           json={"model": model, "input": "How are you?"})
        assert reply.status_code == 200, reply.text
        counts[model] = reply.json()["input_tokens"]
    assert counts["smol-templated"] > counts["tiny-chat"], counts


def test_files_that_cannot_be_served_are_503_naming_them_and_the_rest_serve(served: LiveServer) -> None:
    for model, named in (("not-a-model", "not-a-model.gguf is not a GGUF file"),
                         ("broken-template", "chat template of model 'broken-template'")):
        reply = respond(served, model)
        assert reply.status_code == 503, reply.text
        validate_error_body(reply.json())
        assert reply.json()["error"]["code"] == "model_unavailable"
        assert named in reply.json()["error"]["message"]
        assert int(reply.headers["retry-after"]) > 0
        assert listed(served)[model]["status"] == "error"
    assert respond(served, "tiny-chat").status_code == 200


def test_paths_of_the_operators_disk_stay_out_of_the_replies(served: LiveServer) -> None:
    message = respond(served, "not-a-model").json()["error"]["message"]
    assert os.sep + "models" + os.sep not in message, message
