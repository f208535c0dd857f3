"""``ors codex`` as a user runs it, against the real server: the Codex home it writes and
how it starts Codex. Codex itself is a fake here (``tests/fake_codex.py``, which records
what it was handed); ``tests/e2e/test_codex_real.py`` runs the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.main import create_app
from tests import fake_codex
from tests.codex_model_info import check_catalog
from tests.live import LiveServer, free_port

KEY = "k1"


@pytest.fixture(scope="module")
def keyed(scripted: ScriptedBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(default_model="scripted-text", data_dir=tmp_path_factory.mktemp("launcher-server"),
                        api_keys=f"team:{KEY}")  # type: ignore[arg-type]
    server = LiveServer(create_app(settings, backends=[scripted])).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def open_server(scripted: ScriptedBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(default_model="scripted-tool", data_dir=tmp_path_factory.mktemp("launcher-open"))
    server = LiveServer(create_app(settings, backends=[scripted])).start()
    yield server
    server.stop()


@pytest.fixture()
def fake(tmp_path: Path) -> Path:
    """The fake ``codex`` (named as such), in a directory of its own."""
    return fake_codex.install(tmp_path / "fake-bin")


def ors_codex(args: list[str], env: dict[str, str], data_dir: Path) -> subprocess.CompletedProcess[str]:
    """``ors codex ARGS``, as a child process with ``env`` over a clean ``ORS_*`` environment."""
    base = {name: value for name, value in os.environ.items() if not name.startswith("ORS_")}
    full = {**base, "ORS_DATA_DIR": str(data_dir), "FAKE_CODEX_RECORD": str(data_dir / "record.json"), **env}
    return subprocess.run([sys.executable, "-m", "app.cli", "codex", *args], env=full, capture_output=True,
                          text=True, timeout=120)


def record(data_dir: Path) -> dict[str, Any]:
    return json.loads((data_dir / "record.json").read_text())  # type: ignore[no-any-return]


def test_codex_gets_a_home_of_its_own_with_the_server_and_its_catalog(
        keyed: LiveServer, fake: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"ORS_CODEX_BIN": str(fake), "ORS_PORT": str(keyed.port), "ORS_API_KEYS": f"team:{KEY},other:k2",
           "ORS_CODEX_API_KEY": "stale"}
    done = ors_codex(["--", "exec", "--json", "fix the tests"], env, data)
    assert done.returncode == 0, done.stderr
    seen = record(data)
    home = (data / "codex").resolve()
    assert seen["argv"] == ["exec", "--json", "fix the tests"]
    assert seen["codex_home"] == str(home) and seen["home_mode"] == 0o700
    assert seen["key"] == KEY, "the secret of the first key, handed over in the environment"
    assert {name: file["mode"] for name, file in seen["files"].items()} == {"config.toml": 0o600, "catalog.json": 0o600}
    assert not any(KEY in file["text"] for file in seen["files"].values()), "the key is in no file"

    config = tomllib.loads(seen["files"]["config.toml"]["text"])
    assert config["model_provider"] == "ors" and config["model"] == "scripted-text"
    assert config["model_providers"]["ors"] == {
        "name": "azure", "base_url": f"http://127.0.0.1:{keyed.port}/v1", "wire_api": "responses",
        "supports_websockets": True, "env_key": "ORS_CODEX_API_KEY", "stream_idle_timeout_ms": 1_800_000,
    }
    assert config["model_catalog_json"] == str(home / "catalog.json")

    written = json.loads(seen["files"]["catalog.json"]["text"])
    check_catalog(written, instructions=True)
    served = httpx.get(f"{keyed.url}/v1/models", params={"client_version": fake_codex.VERSION},
                       headers={"Authorization": f"Bearer {KEY}"}).json()
    for entry, plain in zip(written["models"], served["models"], strict=True):
        assert entry["base_instructions"] == fake_codex.INSTRUCTIONS, "Codex's own, whole, from the installed Codex"
        assert entry["model_messages"] == {"instructions_template": fake_codex.INSTRUCTIONS}
        assert {k: v for k, v in entry.items() if k not in ("base_instructions", "model_messages")} == plain


def test_url_model_and_key_flags_and_codex_on_path(keyed: LiveServer, fake: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    done = ors_codex(["--url", keyed.url, "--model", "scripted-tool", "--api-key", KEY, "--", "--version"], env, data)
    assert done.returncode == 0, done.stderr
    assert "codex-cli 0.171.0" in done.stdout, "--version after -- is Codex's"
    config = tomllib.loads((data / "codex" / "config.toml").read_text())
    assert config["model"] == "scripted-tool"
    assert config["model_providers"]["ors"]["base_url"] == f"{keyed.url}/v1", "/v1 added to a bare address"


def test_without_keys_codex_is_given_none(open_server: LiveServer, fake: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"ORS_CODEX_BIN": str(fake), "ORS_PORT": str(open_server.port), "ORS_CODEX_API_KEY": "stale"}
    done = ors_codex(["--", "exec", "hi"], env, data)
    assert done.returncode == 0, done.stderr
    seen = record(data)
    assert seen["key"] is None
    config = tomllib.loads(seen["files"]["config.toml"]["text"])
    assert "env_key" not in config["model_providers"]["ors"]
    assert config["model"] == "scripted-tool", "the server's default model"


def test_codex_exit_status_is_returned(open_server: LiveServer, fake: Path, tmp_path: Path) -> None:
    env = {"ORS_CODEX_BIN": str(fake), "ORS_PORT": str(open_server.port), "FAKE_CODEX_EXIT": "3"}
    assert ors_codex(["--", "exec", "hi"], env, tmp_path / "data").returncode == 3


def test_a_model_the_server_does_not_list_is_warned_of(open_server: LiveServer, fake: Path, tmp_path: Path) -> None:
    env = {"ORS_CODEX_BIN": str(fake), "ORS_PORT": str(open_server.port)}
    done = ors_codex(["--model", "nobody/serves-this", "--", "exec", "hi"], env, tmp_path / "data")
    assert done.returncode == 0
    assert "does not list 'nobody/serves-this'" in done.stderr


def test_missing_codex_says_how_to_install_it(open_server: LiveServer, tmp_path: Path) -> None:
    env = {"ORS_CODEX_BIN": "codex-that-is-not-installed", "ORS_PORT": str(open_server.port)}
    done = ors_codex(["--", "exec", "hi"], env, tmp_path / "data")
    assert done.returncode == 2
    assert "Codex is not installed" in done.stderr and "npm install -g @openai/codex" in done.stderr


def test_no_server_is_said_plainly(fake: Path, tmp_path: Path) -> None:
    env = {"ORS_CODEX_BIN": str(fake), "ORS_PORT": str(free_port())}
    done = ors_codex(["--", "exec", "hi"], env, tmp_path / "data")
    assert done.returncode == 2
    assert "no server answers at http://127.0.0.1:" in done.stderr and "ors serve" in done.stderr
    assert not (tmp_path / "data" / "record.json").exists(), "Codex was not started"


def test_a_refused_key_is_said_plainly(keyed: LiveServer, fake: Path, tmp_path: Path) -> None:
    env = {"ORS_CODEX_BIN": str(fake), "ORS_PORT": str(keyed.port)}
    done = ors_codex(["--api-key", "wrong", "--", "exec", "hi"], env, tmp_path / "data")
    assert done.returncode == 2
    assert "refused the key" in done.stderr


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://example.com/v1"])
def test_a_url_that_is_no_http_url_is_refused(fake: Path, tmp_path: Path, url: str) -> None:
    done = ors_codex(["--url", url, "--", "exec", "hi"], {"ORS_CODEX_BIN": str(fake)}, tmp_path / "data")
    assert done.returncode == 2
    assert "--url must be an http(s) URL" in done.stderr


def test_a_bad_setting_is_named(fake: Path, tmp_path: Path) -> None:
    done = ors_codex(["--", "exec", "hi"], {"ORS_CODEX_BIN": str(fake), "ORS_PORT": "not-a-port"}, tmp_path / "data")
    assert done.returncode == 2
    assert "ORS_PORT" in done.stderr and "Traceback" not in done.stderr
