"""``ors codex [--url URL] [--model ID] [--api-key KEY] [-- CODEX ARGS]``: Codex on this server.

Runs the installed Codex CLI (``ORS_CODEX_BIN``, by default ``codex`` on ``PATH``) with a
Codex home of its own, ``ORS_DATA_DIR/codex`` (0700), so the user's own Codex
configuration, sessions and login are neither used nor touched. Before Codex starts:

1. ``codex --version`` gives the version Codex will ask the catalog for;
2. the server's catalog, ``GET {url}/models?client_version=<version>``
   (:mod:`app.engine.codex_catalog`), is fetched with the key and written to
   ``catalog.json`` in the home, each entry given Codex's own default instructions, read
   from the installed Codex (:func:`default_instructions`): the server cannot know them,
   and a model without them would run without Codex's instructions;
3. ``config.toml`` in the home names one provider, ``ors``, at ``url`` (by default the
   local ``ors serve`` address of the settings), speaking ``responses`` over WebSocket,
   with the catalog as ``model_catalog_json``, so Codex knows each model's window,
   tools and modalities and warns of no missing metadata. The key (``--api-key``, else
   the first of ``ORS_API_KEYS``) is never written: the provider's ``env_key`` names the
   variable :data:`KEY_VARIABLE` it is handed in.

The provider's ``name`` is ``azure``: Codex compacts a long conversation on the server
(remote compaction) only for a provider it takes for OpenAI's or Azure's, and of the two
names only this one changes nothing else it sends (:data:`PROVIDER_NAME`).

Then Codex replaces this process (``exec``), with the arguments after ``--``. Exit
status: Codex's own; 2 when Codex cannot be started (not installed, no server at the
URL, a key refused).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from app.config import Settings
from app.transport.auth import parse_key

INSTALL_HINT = "Install it with `npm install -g @openai/codex` (Node.js 18 or later), or name it with ORS_CODEX_BIN."
PROVIDER_ID = "ors"
PROVIDER_NAME = "azure"
"""The provider's ``name``. Codex 0.171 runs compaction on the server (it appends a
``compaction_trigger`` to the request) only for a provider named ``OpenAI`` exactly, or
one it takes for Azure's (named ``azure`` in any case, or at an Azure address); any
other provider gets a summary asked of the model as a user message. Measured against
the real Codex: as ``OpenAI`` it also adds OpenAI's private
``internal_chat_message_metadata_passthrough`` to every input message, which this
server refuses as an unknown parameter; as ``azure`` its requests are otherwise those
of any provider (the same tools and input, ``store: false``, the key as a bearer token,
WebSocket when ``supports_websockets``), and no login is asked for
(``requires_openai_auth`` stays off)."""
STREAM_IDLE_MS = 30 * 60 * 1000
"""How long Codex waits for the next event of a stream before it drops the connection and
sends the request again, at most 5 times. Its default, 5 minutes, is less than the
embedded model on two busy cores takes to read Codex's first request (about 9,500
tokens at 25 to 35 tokens a second): the first turn was dropped and sent again each 5
minutes until the prefix cache had caught up. The server ends the stream of a model
that hangs itself (``ORS_MODEL_HANG_SECONDS``)."""
KEY_VARIABLE = "ORS_CODEX_API_KEY"
"""The environment variable Codex reads the server's key from (the provider's ``env_key``)."""
HOME_DIR = "codex"
CATALOG_FILE = "catalog.json"
CONFIG_FILE = "config.toml"
FETCH_SECONDS = 30.0
VERSION = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?")
EXIT_UNAVAILABLE = 2


class LaunchError(Exception):
    """Codex cannot be started as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Launch:
    """What :func:`prepare` made: the command to run and its environment."""

    argv: list[str]
    env: dict[str, str]
    home: Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="the server's base URL, e.g. http://127.0.0.1:8080/v1 "
                        "[default: the ors serve address of ORS_HOST and ORS_PORT]")
    parser.add_argument("--model", help="the model Codex uses [default: the server's default model]")
    parser.add_argument("--api-key", help="the server's key [default: the first of ORS_API_KEYS]; "
                        f"handed to Codex in {KEY_VARIABLE}, never written to a file")
    parser.add_argument("codex_args", nargs=argparse.REMAINDER, metavar="-- CODEX ARGS",
                        help="arguments for Codex, after --: `ors codex -- exec 'fix the tests'`")


def run(args: argparse.Namespace) -> int:
    try:
        settings = Settings()
    except ValidationError as exc:
        for error in exc.errors():
            name = ".".join(str(part) for part in error["loc"])
            print(f"ors codex: ORS_{name.upper()}: {error['msg']}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        launch = prepare(settings, url=args.url, model=args.model, api_key=args.api_key,
                         codex_args=args.codex_args, environ=os.environ)
    except LaunchError as exc:
        print(f"ors codex: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(launch.argv[0], launch.argv, launch.env)


def prepare(settings: Settings, *, url: str | None, model: str | None, api_key: str | None,
            codex_args: Sequence[str], environ: Mapping[str, str]) -> Launch:
    """Find Codex, write its home, and say how to run it; nothing is started but
    ``codex --version``, and the server is asked for its catalog."""
    codex = find_codex(settings.codex_bin, environ)
    version = codex_version(codex)
    base_url = normalized_url(url or local_url(settings.host, settings.port))
    key = api_key if api_key is not None else first_key(settings)
    catalog = fetch_catalog(base_url, key, version)
    if not catalog.get("models"):
        raise LaunchError(f"the server at {base_url} lists no models")
    home = (settings.data_dir / HOME_DIR).resolve()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    home.chmod(0o700)
    instructions = default_instructions(codex, home, environ)
    for entry in catalog["models"]:
        entry["base_instructions"] = instructions
        entry["model_messages"] = {"instructions_template": instructions}
    chosen = model or catalog["models"][0]["slug"]
    if chosen not in {entry["slug"] for entry in catalog["models"]}:
        print(f"ors codex: warning: the server at {base_url} does not list {chosen!r}; "
              "Codex will use generic metadata for it", file=sys.stderr)
    catalog_path = home / CATALOG_FILE
    write_private(catalog_path, json.dumps(catalog, indent=1) + "\n")
    settings_toml = codex_settings(base_url, chosen, catalog_path, keyed=key is not None)
    write_private(home / CONFIG_FILE, render_toml(settings_toml))
    env = {**environ, "CODEX_HOME": str(home)}
    env.pop(KEY_VARIABLE, None)
    if key is not None:
        env[KEY_VARIABLE] = key
    args = list(codex_args)
    if args[:1] == ["--"]:
        args = args[1:]
    return Launch(argv=[str(codex), *args], env=env, home=home)


def find_codex(setting: str, environ: Mapping[str, str]) -> Path:
    """The Codex executable ``setting`` names (a path, or a name on ``PATH``)."""
    found = shutil.which(setting, path=environ.get("PATH"))
    if found is None:
        where = "is not an executable" if os.sep in setting else "is not on PATH"
        raise LaunchError(f"Codex is not installed: {setting!r} {where}. {INSTALL_HINT}")
    return Path(found).absolute()


def codex_version(codex: Path) -> str:
    """The version ``codex --version`` prints (``codex-cli 0.171.0`` → ``0.171.0``)."""
    try:
        done = subprocess.run([str(codex), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"{codex} --version failed: {exc}. {INSTALL_HINT}") from exc
    found = VERSION.search(done.stdout)
    if done.returncode != 0 or found is None:
        raise LaunchError(f"{codex} --version printed no version ({done.stdout.strip() or done.stderr.strip()!r})")
    return found.group(0)


def default_instructions(codex: Path, home: Path, environ: Mapping[str, str]) -> str:
    """Codex's own instructions for a model set up as this server's are, whole: those of
    the first model (by priority, among those its picker lists) of the catalog the
    installed Codex carries (``codex debug models --bundled``) that runs on the same
    tools, direct calls without Responses Lite; if none does, of its first model."""
    try:
        done = subprocess.run([str(codex), "debug", "models", "--bundled"], capture_output=True, text=True,
                              timeout=120, check=False, env={**environ, "CODEX_HOME": str(home)})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"{codex} debug models --bundled failed: {exc}") from exc
    try:
        models = json.loads(done.stdout)["models"]
        listed = sorted((model for model in models if model.get("visibility") == "list"),
                        key=lambda model: model.get("priority", 0))
    except (ValueError, KeyError, TypeError, AttributeError):
        reason = done.stderr.strip().splitlines()[:1] or [done.stdout[:200]]
        raise LaunchError(f"{codex} debug models --bundled printed no model catalog ({reason[0]!r}); "
                          f"ors codex needs a Codex that has this command (0.171 has it). {INSTALL_HINT}") from None
    direct = [model for model in listed
              if not model.get("use_responses_lite") and model.get("tool_mode") in (None, "direct")]
    for model in [*direct, *listed]:
        text = model.get("base_instructions") or (model.get("model_messages") or {}).get("instructions_template")
        if isinstance(text, str) and text.strip():
            return text
    raise LaunchError(f"the catalog that {codex} carries holds no instructions to give the server's models")


def local_url(host: str, port: int) -> str:
    """The address of the local ``ors serve``: a wildcard bind is reached on loopback."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1"


def normalized_url(url: str) -> str:
    """``url`` without a trailing ``/``, with ``/v1`` added when it names no path."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise LaunchError(f"--url must be an http(s) URL like http://127.0.0.1:8080/v1, got {url!r}")
    url = url.rstrip("/")
    return url + "/v1" if parts.path in ("", "/") else url


def first_key(settings: Settings) -> str | None:
    """The secret of the first ``ORS_API_KEYS`` entry, if there is one."""
    if not settings.api_keys:
        return None
    return parse_key(settings.api_keys[0].get_secret_value()).secret


def fetch_catalog(base_url: str, key: str | None, version: str) -> dict[str, Any]:
    """The server's Codex catalog for Codex ``version``."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    url = f"{base_url}/models"
    try:
        answer = httpx.get(url, params={"client_version": version}, headers=headers, timeout=FETCH_SECONDS)
    except httpx.HTTPError as exc:
        raise LaunchError(f"no server answers at {base_url} ({exc}). Start one with `ors serve`, "
                          "or name another with --url.") from exc
    if answer.status_code == 401:
        raise LaunchError(f"the server at {base_url} refused the key: give it with --api-key, "
                          "or set ORS_API_KEYS as the server has it")
    if answer.status_code != 200:
        raise LaunchError(f"GET {url} answered {answer.status_code}: {answer.text[:300]}")
    try:
        catalog = answer.json()
    except ValueError as exc:
        raise LaunchError(f"GET {url} answered no JSON; is {base_url} an ors server?") from exc
    if not isinstance(catalog, dict) or not isinstance(catalog.get("models"), list):
        raise LaunchError(f"GET {url} answered no Codex catalog; is {base_url} an ors server of this version?")
    return catalog


def codex_settings(base_url: str, model: str, catalog: Path, *, keyed: bool) -> dict[str, Any]:
    """The ``config.toml`` of the home, as a mapping (see the module docstring). Codex's
    hosted web search is off (this server runs none), and so is its image generation."""
    provider: dict[str, Any] = {
        "name": PROVIDER_NAME,
        "base_url": base_url,
        "wire_api": "responses",
        "supports_websockets": True,
        "stream_idle_timeout_ms": STREAM_IDLE_MS,
    }
    if keyed:
        provider["env_key"] = KEY_VARIABLE
    return {
        "model": model,
        "model_provider": PROVIDER_ID,
        "model_catalog_json": str(catalog),
        "check_for_update_on_startup": False,
        "web_search": "disabled",
        "features": {"image_generation": False},
        "model_providers": {PROVIDER_ID: provider},
    }


def render_toml(table: Mapping[str, Any]) -> str:
    """``table`` as TOML: plain values first, then each sub-table under its header."""
    return "\n".join(_toml_lines(table, ())) + "\n"


def _toml_lines(table: Mapping[str, Any], path: tuple[str, ...]) -> list[str]:
    plain = {key: value for key, value in table.items() if not isinstance(value, Mapping)}
    tables = {key: value for key, value in table.items() if isinstance(value, Mapping)}
    lines = [f"[{'.'.join(map(_toml_key, path))}]"] if path and (plain or not tables) else []
    lines += [f"{_toml_key(key)} = {_toml_value(value)}" for key, value in plain.items()]
    for key, value in tables.items():
        block = _toml_lines(value, (*path, key))
        lines += block if block[:1] == [""] else ["", *block]
    return lines


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    """A string as a JSON string (which is a TOML basic string), a bool, a number, a list."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, replacing it whole."""
    partial = path.with_name(path.name + ".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(partial, path)
