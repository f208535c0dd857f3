"""``ors serve`` as a user runs it: a child process configured by ``ORS_*`` variables."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.client import Client
from tests.conftest import SMOL
from tests.live import ServerProcess, free_port
from tests.upstream_server import chunk, running_scripted_upstream


@pytest.fixture(scope="module")
def process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess({"ORS_DEFAULT_MODEL": SMOL, "ORS_API_KEYS": "k1,k2"}, tmp_path_factory.mktemp("cli"))
    server.start()
    yield server
    server.kill()


@pytest.mark.model
def test_serves_the_configured_default_model(process: ServerProcess) -> None:
    client = Client(process.url, api_key="k2")
    response = client.create(input="Hello!", max_output_tokens=16)
    assert response["model"] == SMOL
    result = client.stream(input="Hello!", max_output_tokens=16)
    assert result.final["model"] == SMOL


@pytest.mark.model
def test_models_and_health(process: ServerProcess) -> None:
    assert httpx.get(f"{process.url}/healthz").status_code == 200
    models = httpx.get(f"{process.url}/v1/models", headers={"Authorization": "Bearer k1"}).json()
    assert {m["id"] for m in models["data"]} >= {SMOL, "qwen2.5-coder-1.5b-instruct"}


@pytest.mark.model
def test_api_keys_are_required(process: ServerProcess) -> None:
    reply = httpx.post(f"{process.url}/v1/responses", json={"input": "x"})
    assert reply.status_code == 401
    assert reply.json()["error"]["code"] == "invalid_api_key"
    wrong = httpx.post(f"{process.url}/v1/responses", json={"input": "x"}, headers={"Authorization": "Bearer k3"})
    assert wrong.status_code == 401


@pytest.mark.model
def test_sigterm_shuts_down_cleanly(tmp_path: Path) -> None:
    server = ServerProcess({"ORS_DEFAULT_MODEL": SMOL}, tmp_path).start()
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    # uvicorn finishes its shutdown, then re-raises the signal to end as a SIGTERM'd process
    assert server.process.wait(timeout=30) in (0, -signal.SIGTERM)
    log = server.log()
    assert "no API keys configured" in log and "Application shutdown complete" in log


def test_help_lists_the_commands() -> None:
    ors = Path(sys.executable).parent / "ors"
    result = subprocess.run([str(ors), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "serve" in result.stdout


@pytest.mark.model
def test_sigterm_during_a_stream_still_ends_it_properly(tmp_path: Path) -> None:
    from compliance import check_sse_body

    server = ServerProcess({"ORS_DEFAULT_MODEL": SMOL}, tmp_path).start()
    assert server.process is not None
    body = {"input": "Write a very long story about the sea.", "max_output_tokens": 2000, "stream": True}
    raw = bytearray()
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as reply:
        for chunk in reply.iter_raw():
            if b"event: response.output_text.delta" not in raw and b"event: response.output_text.delta" in raw + chunk:
                server.process.send_signal(signal.SIGTERM)  # once the stream is under way
            raw += chunk
    final = check_sse_body(bytes(raw))
    assert final["status"] == "failed" and final["error"]["code"] == "server_shutting_down"
    assert server.process.wait(timeout=30) in (0, -signal.SIGTERM)


def _llama_servers_of(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split()
        except OSError:
            continue
        if fields[1] == "(llama-server)" and int(fields[3]) == parent and fields[2] != "Z":
            found.append(int(fields[0]))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.model
def test_no_model_server_outlives_a_killed_ors(tmp_path: Path) -> None:
    """SIGKILL gives ors no chance to stop its llama-server: the child dies with it."""
    server = ServerProcess({"ORS_DEFAULT_MODEL": SMOL}, tmp_path).start()
    assert server.process is not None
    children = _llama_servers_of(server.process.pid)
    assert len(children) == 1
    server.kill()
    deadline = time.monotonic() + 30  # a bound, not a measurement
    while _alive(children[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(children[0])


@pytest.mark.model
def test_a_stopped_ors_stops_its_model_server(tmp_path: Path) -> None:
    server = ServerProcess({"ORS_DEFAULT_MODEL": SMOL}, tmp_path).start()
    assert server.process is not None
    children = _llama_servers_of(server.process.pid)
    assert server.terminate() in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its shutdown
    assert children and not any(_alive(child) for child in children)
    assert (tmp_path / "kv" / SMOL).is_dir()  # where its slots are saved


@pytest.mark.model
def test_ctrl_c_stops_the_server_and_keeps_what_was_stored(tmp_path: Path) -> None:
    """Ctrl-C in a terminal sends SIGINT to the whole process group: the server drains,
    closes the store (every write handed to it commits) and exits; what it stored is
    there at the next start."""
    server = ServerProcess({"ORS_DEFAULT_MODEL": SMOL}, tmp_path, new_session=True).start()
    assert server.process is not None
    stored = Client(server.url).create(input="Say hi.", max_output_tokens=16)
    os.killpg(server.process.pid, signal.SIGINT)
    assert server.process.wait(timeout=60) in (0, -signal.SIGINT), server.log()
    assert "Traceback" not in server.log()

    again = ServerProcess({"ORS_DEFAULT_MODEL": SMOL}, tmp_path).start()
    try:
        assert httpx.get(f"{again.url}/v1/responses/{stored['id']}").json() == stored
    finally:
        again.kill()


def _without_keys() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items()
            if key not in ("ORS_API_KEYS", "ORS_ALLOW_UNAUTHENTICATED", "ORS_HOST")}


def test_refuses_to_listen_on_all_interfaces_without_keys(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "app.cli", "serve", "--host", "0.0.0.0", "--port", str(free_port())]
    result = subprocess.run(command, env={**_without_keys(), "ORS_DATA_DIR": str(tmp_path)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Refusing to listen on 0.0.0.0 without API keys" in result.stderr
    assert "ORS_API_KEYS" in result.stderr and "ORS_ALLOW_UNAUTHENTICATED=true" in result.stderr
    assert not (tmp_path / "ors.db").exists()  # refused before anything was opened


def test_listens_on_all_interfaces_when_explicitly_allowed(tmp_path: Path) -> None:
    """With the override (and a model served by an upstream, so no local model loads)."""
    with running_scripted_upstream() as upstream:
        model = upstream.stream(chunk(content="Hi"), chunk(finish_reason="stop"), "data: [DONE]\n\n")
        env = {**_without_keys(), "ORS_ALLOW_UNAUTHENTICATED": "true", "ORS_UPSTREAM_URL": upstream.base_url,
               "ORS_DEFAULT_MODEL": model}
        server = ServerProcess(env, tmp_path, host="0.0.0.0").start()
        try:
            response = Client(server.url).create(input="Hello!")
            assert response["status"] == "completed" and response["model"] == model
        finally:
            assert server.terminate() in (0, -signal.SIGTERM)
    assert "listening on 0.0.0.0 without API keys" in server.log()


@pytest.mark.model
def test_what_the_server_writes_is_readable_by_its_user_only(tmp_path: Path) -> None:
    """The store, the prompt caches, the model server's log and the key: mode 0600 files
    in 0700 directories, whatever the umask it was started with (here the usual 022)."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    server = ServerProcess({"ORS_DEFAULT_MODEL": SMOL, "ORS_LOG_LEVEL": "info"}, data).start()
    assert httpx.post(f"{server.url}/v1/responses", json={"input": "Say hi.", "max_output_tokens": 16},
                      timeout=60).status_code == 200
    assert server.terminate() in (0, -signal.SIGTERM)  # the slots are saved as it stops
    assert "can be read by other users" not in server.log()
    written = [path for path in data.rglob("*") if path != server.log_path]
    assert {path.name for path in written} >= {"ors.db", "secret.key", "kv", SMOL, "logs", f"{SMOL}.log"}
    assert any(path.name.startswith("slot-") for path in written)
    for path in written:
        assert path.stat().st_mode & 0o077 == 0, f"{path} is mode {path.stat().st_mode & 0o777:o}"


@pytest.mark.model
def test_a_data_directory_others_can_read_is_named_in_a_warning(tmp_path: Path) -> None:
    data = tmp_path / "shared"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    server = ServerProcess({"ORS_DEFAULT_MODEL": SMOL}, data).start()
    try:
        assert f"The data directory {data} can be read by other users (mode 755)" in server.log()
    finally:
        server.terminate()
