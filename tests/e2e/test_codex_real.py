"""The real Codex CLI (the version package.json pins, which make installs in
node_modules) through ``ors codex``, against the real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.backends.base import Delta, GenerationRequest
from app.backends.local import LocalBackend
from app.backends.scripted import ScriptedBackend, text_script
from app.codex_launcher import default_instructions
from app.config import Settings
from app.main import create_app
from compliance.stream import TERMINAL_EVENT_TYPES, StreamChecker
from tests.asgi_tap import Connection, Tap
from tests.codex_model_info import check_catalog
from tests.conftest import QWEN, SMOL
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


SUMMARY = "The user asked for a greeting and was greeted."
"""What the scripted model answers when the server has it summarise a conversation."""
COMPACT_LIMIT = 200
"""A ``model_auto_compact_token_limit`` below what Codex's first turn costs (its
instructions and tools alone are thousands of words, the scripted model's usage)."""


def _summarising_script(request: GenerationRequest) -> list[Delta]:
    """Codex offers tools on every turn it sends; the server's summariser offers none."""
    return text_script(SUMMARY) if not request.tools else text_script("Hello", ", ", "world", ".")


@pytest.fixture
def tapped(tmp_path: Path) -> Iterator[tuple[LiveServer, ScriptedBackend, list[Connection]]]:
    """The real server on a scripted model that tells a summary from an answer, with every
    WebSocket frame either way recorded."""
    backend = ScriptedBackend({"scripted-text": _summarising_script})
    app = create_app(Settings(default_model="scripted-text", data_dir=tmp_path / "server"), backends=[backend])
    log: list[Connection] = []
    app.add_middleware(Tap, log=log)
    server = LiveServer(app).start()
    yield server, backend, log
    server.stop()


@pytest.fixture(scope="module")
def qwen_codex(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, list[Connection]]]:
    """The real server on its default model, the embedded Qwen, as ``ors serve`` runs it
    (its own data directory, so the prompt cache Codex's first session fills stays for the
    next), decoding greedily (``ORS_MODEL_TEMPERATURE=0``: Codex sends no temperature),
    with every WebSocket frame recorded."""
    settings = Settings(default_model=QWEN, data_dir=tmp_path_factory.mktemp("codex-qwen"), model_temperature=0)
    local = LocalBackend(model_dir, n_threads=2, preload=[QWEN], models=[QWEN], temperature=settings.model_temperature)
    app = create_app(settings, backends=[local])
    log: list[Connection] = []
    app.add_middleware(Tap, log=log)
    server = LiveServer(app).start()
    yield server, log
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


@pytest.mark.codex
def test_codex_compacts_on_the_server_and_continues(
        codex: Path, tapped: tuple[LiveServer, ScriptedBackend, list[Connection]], tmp_path: Path) -> None:
    """A session through ``ors codex`` resumed with a compaction limit its history
    exceeds: Codex sends a turn whose input ends with ``compaction_trigger`` over its
    WebSocket (remote compaction, as the provider named ``azure`` gets), the server
    answers one ``compaction`` item, Codex carries that item into the next turn, the
    server reads the summary back to the model, and the task completes; nothing goes
    over HTTP, neither ``POST /v1/responses`` nor ``/v1/responses/compact``."""
    server, backend, log = tapped
    repo = repository(tmp_path / "repo")
    posts = _posted(server, "/v1/responses"), _posted(server, "/v1/responses/compact")
    first = ors_codex(codex, server.url, tmp_path / "data", ["exec", "-C", str(repo), "Say hello."])
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Hello, world." in first.stdout
    assert not [turn for turn in _turns(log) if _is_compaction(turn[0])], "no limit, no compaction"
    opened = len(log)

    second = ors_codex(codex, server.url, tmp_path / "data", [
        "exec", "-C", str(repo), "-c", f"model_auto_compact_token_limit={COMPACT_LIMIT}",
        "resume", "--last", "Say hello again."])
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Hello, world." in second.stdout
    assert METADATA_WARNING not in second.stdout + second.stderr
    assert "context compacted" in second.stderr

    turns = _turns(log[opened:])
    compactions = [index for index, (request, _) in enumerate(turns) if _is_compaction(request)]
    assert len(compactions) == 1, [request["input"][-1:] for request, _ in turns]
    request, compacted = turns[compactions[0]]
    assert compacted["status"] == "completed"
    assert [item["type"] for item in compacted["output"]] == ["compaction"], compacted["output"]
    sealed = compacted["output"][0]["encrypted_content"]
    assert sealed
    assert any(item.get("role") == "user" and "Say hello." in json.dumps(item) for item in request["input"])

    later = turns[compactions[0] + 1:]
    carried = [(request, final) for request, final in later
               if any(item.get("type") == "compaction" and item.get("encrypted_content") == sealed
                      for item in request["input"])]
    assert carried, "Codex's next turn carries the compaction item the server sealed"
    request, answered = carried[-1]
    assert answered["status"] == "completed"
    assert "Hello, world." in json.dumps(answered["output"])
    assert "Say hello again." in json.dumps(request["input"])
    assert not any(item.get("type") == "compaction_trigger" for request, _ in later for item in request["input"])

    summarised = [request for request in backend.requests if not request.tools]
    assert len(summarised) == 1 and "Say hello." in summarised[0].messages[-1].content
    assert any(SUMMARY in message.content for message in backend.requests[-1].messages), \
        "the summary the item seals reached the model on the turn after it"
    assert (_posted(server, "/v1/responses"), _posted(server, "/v1/responses/compact")) == posts
    for _, final in _turns(log):
        listed = httpx.get(f"{server.url}/v1/responses/{final['id']}/input_items", timeout=10)
        assert listed.status_code in (200, 404), listed.text
        if listed.status_code == 200:
            assert all(item["type"] != "compaction_trigger" for item in listed.json()["data"])


@pytest.mark.codex
def test_codex_compacts_in_the_client_under_another_provider_name(
        codex: Path, tapped: tuple[LiveServer, ScriptedBackend, list[Connection]], tmp_path: Path) -> None:
    """Why ``ors codex`` names its provider ``azure``: named otherwise, the same session
    sends no ``compaction_trigger``, and Codex asks the model for a summary in a turn of
    its own instead (local compaction)."""
    server, _, log = tapped
    repo = repository(tmp_path / "repo")
    assert ors_codex(codex, server.url, tmp_path / "data", ["exec", "-C", str(repo), "Say hello."]).returncode == 0
    opened = len(log)
    second = ors_codex(codex, server.url, tmp_path / "data", [
        "exec", "-C", str(repo), "-c", f"model_auto_compact_token_limit={COMPACT_LIMIT}",
        "-c", 'model_providers.ors.name="ors"', "resume", "--last", "Say hello again."])
    assert second.returncode == 0, second.stderr[-3000:]
    assert "context compacted" in second.stderr, "Codex compacted, on its side"
    turns = _turns(log[opened:])
    assert turns and not [turn for turn in turns if _is_compaction(turn[0])]
    assert not any(item.get("type") == "compaction" for request, _ in turns for item in request["input"])


TASK = "Add the line checked to notes.txt by running `echo checked >> notes.txt && cat notes.txt`."
FOLLOW_UP = "Now add the line done to notes.txt by running `echo done >> notes.txt && cat notes.txt`."
"""Tasks that name their commands, for a 1.5B model, and commands that show what they
did. What Qwen2.5-Coder 1.5B does after its first command is its own: it ran it again
(given the empty output of a bare ``echo … >> notes.txt``), or called ``write_stdin``
with a session id of its own making, and a session resumed from such a history may
answer with advice instead of a call; so the test holds the continuation to what the
server and Codex do, not to the model's choice."""
WRITE = ["-s", "workspace-write"]
"""Codex's sandbox that lets a task write in its repository (``exec`` reads only by default)."""


@pytest.mark.codex
@pytest.mark.model
@pytest.mark.timeout(5 * EXEC_SECONDS)
def test_codex_does_a_task_on_qwen_over_websocket_and_continues_it(
        codex: Path, qwen_codex: tuple[LiveServer, list[Connection]], tmp_path: Path) -> None:
    """The whole loop on the embedded Qwen through ``ors codex``: Codex's own instructions
    and tools (about 9,400 tokens: the first-ever session evaluates them, minutes on two
    cores), the model calls Codex's shell tool, Codex runs the command and sends its
    output back over the same WebSocket (the replay gate lets it through: the call the
    model made is held to the tool's schema), and the file changes; then a second task,
    resumed in the same session, carries the first (its call and the call's output) in
    its history, and every call the model makes in either is run by Codex and answered.
    Nothing goes over HTTP."""
    server, log = qwen_codex
    repo = repository(tmp_path / "repo")
    (repo / "notes.txt").write_text("alpha\nbeta\n")
    posts = _responses_posted(server)

    first = ors_codex(codex, server.url, tmp_path / "data", ["exec", *WRITE, "-C", str(repo), TASK],
                      timeout=2 * EXEC_SECONDS)
    turns = _turns(log)
    assert first.returncode == 0, _story(first, turns)
    assert METADATA_WARNING not in first.stdout + first.stderr
    assert "checked" in (repo / "notes.txt").read_text(), _story(first, turns)
    commands = _calls(turns, "exec_command")
    assert commands, _story(first, turns)
    tools = {tool["name"]: tool for tool in turns[0][0]["tools"] if tool.get("type") == "function"}
    for arguments in commands:
        jsonschema.validate(arguments, tools["exec_command"]["parameters"])
    opened = len(log)

    second = ors_codex(codex, server.url, tmp_path / "data", ["exec", *WRITE, "-C", str(repo), "resume", "--last",
                                                              FOLLOW_UP], timeout=2 * EXEC_SECONDS)
    later = _turns(log[opened:])
    assert second.returncode == 0, _story(second, later, turns)
    resumed = [request for request, _ in later if request.get("generate") is not False]
    assert resumed, _story(second, later, turns)
    history = resumed[0]["input"]
    assert TASK in json.dumps(history) and FOLLOW_UP in json.dumps(history), "the second task carries the first"
    first_call = next(item for _, final in turns for item in final["output"] if item["type"] == "function_call")
    assert any(item.get("type") == "function_call_output" and item.get("call_id") == first_call["call_id"]
               for item in history), "with the first task's call answered"
    for session in (turns, later):
        for index, (_, final) in enumerate(session):
            for call in (item for item in final["output"] if item["type"] == "function_call"):
                following = session[index + 1][0]["input"] if index + 1 < len(session) else []
                assert any(item.get("type") == "function_call_output" and item.get("call_id") == call["call_id"]
                           for item in following), f"Codex ran {call['name']} and sent its output back"
    assert all(final["status"] == "completed" for _, final in turns + later)
    assert _responses_posted(server) == posts


def _calls(turns: list[tuple[dict[str, object], dict[str, object]]], name: str) -> list[dict[str, object]]:
    """The arguments of every call of ``name`` the model made in ``turns``."""
    return [json.loads(item["arguments"]) for _, final in turns for item in final["output"]  # type: ignore[attr-defined]
            if item["type"] == "function_call" and item["name"] == name]


def _story(done: subprocess.CompletedProcess[str], turns: list[tuple[dict[str, object], dict[str, object]]],
           before: Sequence[tuple[dict[str, object], dict[str, object]]] = ()) -> str:
    """What Codex printed and what the model answered (in an earlier session too), for a
    failure's message."""
    answers = [json.dumps(final["output"])[:600] for _, final in turns]
    earlier = [json.dumps(final["output"])[:600] for _, final in before]
    return f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}\nmodel turns: {answers}\nearlier session's: {earlier}"


def _is_compaction(request: dict[str, object]) -> bool:
    items = request.get("input")
    return isinstance(items, list) and bool(items) and items[-1] == {"type": "compaction_trigger"}


def _turns(connections: list[Connection]) -> list[tuple[dict[str, object], dict[str, object]]]:
    """Each ``response.create`` of the connections with the final response of its turn,
    in order; every event is checked (the vendored spec's schemas, WebSocket rules).
    Codex runs one turn at a time on a connection, without ``stream_id``."""
    turns = []
    for connection in connections:
        requests = [frame for frame in connection.received() if frame.get("type") == "response.create"]
        checker = StreamChecker(transport="websocket")
        finals = []
        for event in connection.sent():
            checker.feed(event)
            if event["type"] in TERMINAL_EVENT_TYPES:
                finals.append(checker.finish())
                checker = StreamChecker(transport="websocket")
        assert len(finals) == len(requests), (connection.path, [frame.get("type") for frame in connection.sent()])
        turns += list(zip(requests, finals, strict=True))
    return turns


def _responses_posted(server: LiveServer) -> float:
    return _posted(server, "/v1/responses")


def _posted(server: LiveServer, route: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "ors_http_requests_total" and sample.labels.get("route") == route
               and sample.labels.get("method") == "POST")
