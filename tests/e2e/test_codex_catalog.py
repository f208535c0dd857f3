"""Codex's model catalog, ``GET /v1/models?client_version=…``, through the real server:
Codex's shape with the parameter, OpenAI's list without it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.backends.local import HOLDS_LARK_GRAMMARS, LocalBackend
from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.main import create_app
from compliance import validate_error_body
from tests.codex_model_info import check_catalog
from tests.conftest import QWEN, SMOL
from tests.live import LiveServer

VERSION = "0.171.0"


@pytest.fixture(scope="module")
def scripted_server(scripted: ScriptedBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(default_model="scripted-tool", data_dir=tmp_path_factory.mktemp("catalog"),
                        api_keys="team:k1", model_aliases={"gpt-4o-mini": "scripted-text"})  # type: ignore[arg-type]
    server = LiveServer(create_app(settings, backends=[scripted])).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def embedded_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(default_model=SMOL, data_dir=tmp_path_factory.mktemp("catalog-embedded"))
    local = LocalBackend(model_dir, n_threads=2, preload=[SMOL], models=[SMOL, QWEN])
    server = LiveServer(create_app(settings, backends=[local])).start()
    yield server
    server.stop()


def get(server: LiveServer, params: dict[str, str] | None = None, key: str | None = "k1") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{server.url}/v1/models", params=params, headers=headers, timeout=30)


def test_without_client_version_the_list_is_openais(scripted_server: LiveServer) -> None:
    listing = get(scripted_server).json()
    assert listing["object"] == "list" and "models" not in listing
    for model in listing["data"]:
        assert set(model) == {"id", "object", "created", "owned_by", "context_window"}
        assert model["object"] == "model"


def test_with_client_version_the_catalog_is_codexs(scripted_server: LiveServer) -> None:
    listed = {model["id"] for model in get(scripted_server).json()["data"]}
    reply = get(scripted_server, {"client_version": VERSION})
    assert reply.status_code == 200, reply.text
    catalog = reply.json()
    assert set(catalog) == {"models"}
    check_catalog(catalog)
    entries = {entry["slug"]: entry for entry in catalog["models"]}
    assert set(entries) == listed, "every served model and alias, and nothing else"
    assert catalog["models"][0]["slug"] == "scripted-tool", "the default model comes first"
    assert sorted(entry["priority"] for entry in catalog["models"]) == list(range(len(entries)))
    for entry in entries.values():
        # what these models can be counted on for, whatever the backend
        assert entry["use_responses_lite"] is False
        assert entry["supports_parallel_tool_calls"] is True
        assert entry["supported_reasoning_levels"] == [] and "default_reasoning_level" not in entry
        assert entry["apply_patch_tool_type"] is None, "no backend holds a call to a Lark grammar yet"
        # a window nobody told the server is not invented
        assert "context_window" not in entry and "auto_compact_token_limit" not in entry
        assert entry["input_modalities"] == ["text", "image"]


def test_the_catalog_needs_the_key(scripted_server: LiveServer) -> None:
    reply = get(scripted_server, {"client_version": VERSION}, key=None)
    assert reply.status_code == 401
    validate_error_body(reply.json())


@pytest.mark.parametrize("version", ["", "latest", "0.171", "1.2.3; rm -rf /"])
def test_a_client_version_that_is_no_version_is_refused(scripted_server: LiveServer, version: str) -> None:
    reply = get(scripted_server, {"client_version": version})
    assert reply.status_code == 400, reply.text
    validate_error_body(reply.json())
    assert reply.json()["error"]["param"] == "client_version"


@pytest.mark.parametrize("version", ["0.171.0", "0.172.0-alpha.3", "0.0.0"])
def test_codex_versions_are_taken(scripted_server: LiveServer, version: str) -> None:
    assert get(scripted_server, {"client_version": version}).status_code == 200


def test_the_embedded_models_have_their_true_windows_and_no_images(embedded_server: LiveServer) -> None:
    catalog = get(embedded_server, {"client_version": VERSION}, key=None).json()
    check_catalog(catalog)
    entries = {entry["slug"]: entry for entry in catalog["models"]}
    assert list(entries) == [SMOL, QWEN], "the default model first"
    windows = {model["id"]: model["context_window"] for model in get(embedded_server, key=None).json()["data"]}
    assert (windows[SMOL], windows[QWEN]) == (8192, 32768)
    for slug, entry in entries.items():
        assert entry["context_window"] == entry["max_context_window"] == windows[slug]
        assert 0 < entry["auto_compact_token_limit"] < entry["context_window"] * 0.9
        assert entry["input_modalities"] == ["text"]
        assert entry["apply_patch_tool_type"] == ("freeform" if HOLDS_LARK_GRAMMARS else None)
        assert entry["truncation_policy"]["mode"] == "tokens"
        assert 0 < entry["truncation_policy"]["limit"] < entry["context_window"] // 4
