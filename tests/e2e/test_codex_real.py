"""The real Codex CLI (the version package.json pins, which make installs in
node_modules) through ``ors codex``, against the real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.backends.local import LocalBackend
from app.backends.scripted import ScriptedBackend
from app.codex_launcher import default_instructions
from app.config import Settings
from app.main import create_app
from tests.codex_model_info import check_catalog
from tests.conftest import SMOL
from tests.live import LiveServer
from tests.recording import RecordingBackend

CODEX = Path(__file__).resolve().parents[2] / "node_modules" / ".bin" / "codex"
PINNED = json.loads((Path(__file__).resolve().parents[2] / "package.json").read_text())["devDependencies"]["@openai/codex"]
METADATA_WARNING = "Model metadata for"
EXEC_SECONDS = 900
HTTP_ONLY = ["-c", "model_providers.ors.supports_websockets=false"]
"""Codex arguments that keep it on HTTP (``ors codex`` has it speak WebSocket)."""


@pytest.fixture(scope="module")
def codex() -> Path:
    """The pinned Codex, as make installs it. Fails, never skips, when it is missing."""
    if not os.access(CODEX, os.X_OK):
        pytest.fail(f"{CODEX} is missing: `make node_modules/.bin/codex` installs the Codex of package.json")
    return CODEX


@pytest.fixture(scope="module")
def recorded(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, RecordingBackend]]:
    """The real server with SmolLM2, run with a window that holds Codex's first request
    (about 10,000 tokens of instructions and tools; its trained window is 8,192), and
    every request that reaches the model recorded."""
    settings = Settings(default_model=SMOL, data_dir=tmp_path_factory.mktemp("codex-real"))
    local = RecordingBackend(LocalBackend(model_dir, n_threads=2, n_ctx=16_384, preload=[SMOL], models=[SMOL]))
    server = LiveServer(create_app(settings, backends=[local])).start()
    yield server, local
    server.stop()


@pytest.fixture(scope="module")
def scripted_server(scripted: ScriptedBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(default_model="scripted-text", data_dir=tmp_path_factory.mktemp("codex-scripted"))
    server = LiveServer(create_app(settings, backends=[scripted])).start()
    yield server
    server.stop()


def ors_codex(codex: Path, url: str, data: Path, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("ORS_", "CODEX_"))}
    env |= {"ORS_DATA_DIR": str(data), "ORS_CODEX_BIN": str(codex)}
    return subprocess.run([sys.executable, "-m", "app.cli", "codex", "--url", url, "--", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def repository(path: Path) -> Path:
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "README.md").write_text("A repository for Codex to work in.\n")
    return path


@pytest.mark.codex
def test_the_pinned_codex_is_installed(codex: Path) -> None:
    done = subprocess.run([str(codex), "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["codex-cli", PINNED]


@pytest.mark.codex
def test_codex_takes_the_catalog_ors_codex_writes(codex: Path, scripted_server: LiveServer, tmp_path: Path) -> None:
    """Codex parses the catalog file as it parses it for a session (``debug models``
    prints what it read, normalised), and refuses a catalog with one bad entry."""
    done = ors_codex(codex, scripted_server.url, tmp_path, ["debug", "models"])
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout)
    written = json.loads((tmp_path / "codex" / "catalog.json").read_text())
    check_catalog(written, instructions=True)
    assert [entry["slug"] for entry in read["models"]] == [entry["slug"] for entry in written["models"]]
    instructions = default_instructions(codex, tmp_path / "codex", os.environ)
    assert len(instructions) > 10_000, "Codex's own instructions, whole"
    for entry in read["models"]:
        assert entry["base_instructions"] == instructions
        assert entry["use_responses_lite"] is False and entry["apply_patch_tool_type"] is None
        assert entry["supported_reasoning_levels"] == [] and entry["visibility"] == "list"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"models": [{**written["models"][0], "apply_patch_tool_type": "function"}]}))
    refused = subprocess.run([str(codex), "debug", "models", "-c", f"model_catalog_json={json.dumps(str(broken))}"],
                             env={**os.environ, "CODEX_HOME": str(tmp_path / "codex")},
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "unknown variant `function`" in refused.stderr, "the check above can fail"


@pytest.mark.codex
def test_codex_exec_reaches_the_model_with_codexs_instructions(
        codex: Path, recorded: tuple[LiveServer, RecordingBackend], tmp_path: Path) -> None:
    server, backend = recorded
    repo = repository(tmp_path / "repo")
    backend.requests.clear()
    try:
        done = ors_codex(codex, server.url, tmp_path / "data", [
            "exec", "-C", str(repo), "Reply with the single word hello and nothing else."],
            timeout=EXEC_SECONDS)
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:  # a small model may keep calling tools; the first turn is what counts
        output = f"{expired.stdout or ''}{expired.stderr or ''}"
    assert METADATA_WARNING not in output, output[-3000:]
    assert backend.requests, f"no request reached the model: {output[-3000:]}"
    first = backend.requests[0]
    assert first.model == SMOL
    instructions = default_instructions(codex, tmp_path / "data" / "codex", os.environ)
    texts = [message.content for message in first.messages if message.role in ("system", "developer")]
    assert any(instructions.strip() in text for text in texts), "Codex's own instructions reached the model whole"
    assert {tool.name for tool in first.tools} >= {"exec_command"}, "Codex's shell tool was offered"


@pytest.mark.codex
def test_codex_exec_completes_a_turn_over_http(codex: Path, scripted_server: LiveServer, tmp_path: Path) -> None:
    repo = repository(tmp_path / "repo")
    done = ors_codex(codex, scripted_server.url, tmp_path / "data", ["exec", *HTTP_ONLY, "-C", str(repo), "Say hello."])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Hello, world." in done.stdout
    assert METADATA_WARNING not in done.stdout + done.stderr


@pytest.mark.codex
def test_codex_exec_over_websocket(codex: Path, scripted_server: LiveServer, tmp_path: Path) -> None:
    """``ors codex`` has Codex speak WebSocket (its warm-up, then the turn), with no
    fallback to HTTP: the server sees no ``POST /v1/responses`` meanwhile."""
    repo = repository(tmp_path / "repo")
    posts = _responses_posted(scripted_server)
    done = ors_codex(codex, scripted_server.url, tmp_path / "data", ["exec", "-C", str(repo), "Say hello."])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Hello, world." in done.stdout
    assert METADATA_WARNING not in done.stdout + done.stderr
    assert _responses_posted(scripted_server) == posts


def _responses_posted(server: LiveServer) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "ors_http_requests_total" and sample.labels.get("route") == "/v1/responses"
               and sample.labels.get("method") == "POST")
