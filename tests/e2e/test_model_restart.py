"""The embedded model's llama-server, supervised: when it dies under a running ``ors
serve``, the server starts it again, and what clients see meanwhile is a clean end or a
clear 503, never a server that stays broken until someone restarts it.

The child is killed with SIGKILL, as the kernel's out-of-memory killer does. The second
test runs llama-server through a wrapper script that refuses to start while a flag file
exists: the real binary otherwise, a start that fails when the test says so."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import httpx
import pytest

from app.backends.llama_process import find_binary
from compliance import check_response, check_sse_body, validate_error_body
from tests.conftest import SMOL
from tests.e2e.test_cli import _alive, _llama_servers_of
from tests.e2e.test_metrics import scrape, value
from tests.live import ServerProcess

# Every test starts `ors serve` with SmolLM2 as its default model.
pytestmark = pytest.mark.model

SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _child(server: ServerProcess) -> int:
    assert server.process is not None
    children = _llama_servers_of(server.process.pid)
    assert len(children) == 1, children
    return children[0]


def _wait_for_log(server: ServerProcess, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in server.log():
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{server.log()}"
        time.sleep(0.1)


def _ask(server: ServerProcess) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/responses", json={"model": SMOL, "input": "Say hi.", "max_output_tokens": 16},
                      timeout=60)


@pytest.fixture
def server(tmp_path: Path):
    process = ServerProcess({"ORS_DEFAULT_MODEL": SMOL, "ORS_LOG_LEVEL": "info"}, tmp_path).start()
    yield process
    process.kill()


def test_a_model_server_killed_mid_stream_is_started_again(server: ServerProcess) -> None:
    first = _child(server)
    body = {"model": SMOL, "input": "Write a very long story about the sea.", "max_output_tokens": 2000,
            "stream": True}
    raw = bytearray()
    answer = None
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as reply:
        assert reply.status_code == 200
        for chunk in reply.iter_raw():
            raw += chunk
            if answer is None and b"response.output_text.delta" in raw:
                os.kill(first, signal.SIGKILL)
                # at once, while the model is down: this request waits for the restart
                answer = _ask(server)
    final = check_sse_body(bytes(raw))  # one terminal event, a valid stream
    assert final["status"] == "failed" and final["error"]["code"] == "model_unavailable"

    assert answer is not None and answer.status_code == 200, answer and answer.text
    assert check_response(answer.json())["status"] in ("completed", "incomplete")  # generated: at most 16 tokens
    second = _child(server)
    assert second != first and not _alive(first)
    _wait_for_log(server, "exited (killed by SIGKILL)")
    _wait_for_log(server, "is running again (restart 1)")
    metrics = scrape(server.url)
    assert value(metrics, "ors_model_restarts_total", model=SMOL) == 1
    assert value(metrics, "ors_model_up", model=SMOL) == 1

    # and once more: each exit is one restart
    os.kill(second, signal.SIGKILL)
    assert _ask(server).status_code in (200, 503)  # a second exit soon after a restart: no waiting
    deadline = time.monotonic() + 30
    while (reply := _ask(server)).status_code != 200:
        assert reply.status_code == 503 and time.monotonic() < deadline, reply.text
        time.sleep(0.2)
    assert value(scrape(server.url), "ors_model_restarts_total", model=SMOL) == 2


def test_a_model_server_that_cannot_start_again_is_503_until_it_can(tmp_path: Path) -> None:
    flag = tmp_path / "refuse"
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nif [ -e "{flag}" ]; then echo "refusing to start: test flag" >&2; exit 1; fi\n'
                       f'exec "{find_binary()}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    server = ServerProcess({"ORS_DEFAULT_MODEL": SMOL, "ORS_LOG_LEVEL": "info", "ORS_LLAMA_SERVER": str(wrapper)},
                           tmp_path / "data").start()
    try:
        flag.touch()
        os.kill(_child(server), signal.SIGKILL)
        for _ in range(2):  # the first waits for the start under way, the second finds it failed
            reply = _ask(server)
            assert reply.status_code == 503, reply.text
            validate_error_body(reply.json())
            error = reply.json()["error"]
            assert error["type"] == "model_error" and error["code"] == "model_unavailable"
            assert "refusing to start: test flag" in error["message"]
            assert int(reply.headers["retry-after"]) >= 1
        _wait_for_log(server, "could not start again")
        assert value(scrape(server.url), "ors_model_up", model=SMOL) == 0
        ready = httpx.get(f"{server.url}/readyz", timeout=30)
        assert ready.status_code == 503
        assert ready.json() == {"status": "not_ready", "server": "ok", "store": "ok", "models": {SMOL: "restarting"}}

        flag.unlink()  # the next try (after a pause of 1, then 2 s) starts it
        deadline = time.monotonic() + 30
        while (reply := _ask(server)).status_code != 200:
            assert reply.status_code == 503 and time.monotonic() < deadline, reply.text
            time.sleep(0.2)
        assert value(scrape(server.url), "ors_model_restarts_total", model=SMOL) == 1
        ready = httpx.get(f"{server.url}/readyz", timeout=30)
        assert ready.status_code == 200
        assert ready.json() == {"status": "ready", "server": "ok", "store": "ok", "models": {SMOL: "ok"}}

        # a stop while restarts keep failing ends them, and leaves no model server behind
        failed = server.log().count("could not start again")
        flag.touch()
        os.kill(_child(server), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while server.log().count("could not start again") == failed:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.1)
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=30) in (0, -signal.SIGTERM)
        assert not _llama_servers_of(server.process.pid)
    finally:
        server.kill()


def test_the_model_servers_errors_are_in_the_log_and_its_port_needs_its_key(tmp_path: Path) -> None:
    """A slot file that is not one (written here) makes llama-server report an error as
    it is restored at start: ors's own log shows that error. And llama-server's loopback
    port answers no request without the key ors started it with."""
    slots = tmp_path / "kv" / SMOL
    slots.mkdir(parents=True)
    (slots / "slot-0.bin").write_bytes(b"not a slot file" * 100)
    server = ServerProcess({"ORS_DEFAULT_MODEL": SMOL, "ORS_LOG_LEVEL": "info"}, tmp_path).start()
    try:
        _wait_for_log(server, f"ERROR ors.llama_server [-] llama-server {SMOL_FILE}: ")
        assert "unknown (magic, version) for sequence state file" in server.log()  # llama.cpp's own words
        port = int(server.log().split(f"starting llama-server for {SMOL_FILE} on port ")[1].split()[0])
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200  # public
        refused = httpx.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "Hi", "n_predict": 4}, timeout=10)
        assert refused.status_code == 401
        assert httpx.get(f"http://127.0.0.1:{port}/slots", timeout=10).status_code == 401
        assert _ask(server).status_code == 200  # ors itself has the key
    finally:
        server.kill()


def test_a_model_server_that_answers_nothing_is_killed_and_started_again(tmp_path: Path) -> None:
    """SIGSTOP freezes llama-server whole, as a stuck loop freezes its streams: with
    ``ORS_MODEL_HANG_SECONDS=2`` the stream it held ends with ``response.failed`` soon
    after, instead of never, and the next request runs on a new process."""
    server = ServerProcess({"ORS_DEFAULT_MODEL": SMOL, "ORS_LOG_LEVEL": "info", "ORS_MODEL_HANG_SECONDS": "2"},
                           tmp_path).start()
    try:
        first = _child(server)
        body = {"model": SMOL, "input": "Write a very long story about the sea.", "max_output_tokens": 2000,
                "stream": True}
        raw = bytearray()
        stopped = False
        with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as reply:
            for chunk in reply.iter_raw():
                raw += chunk
                if not stopped and b"response.output_text.delta" in raw:
                    os.kill(first, signal.SIGSTOP)
                    stopped = True
        final = check_sse_body(bytes(raw))
        assert final["status"] == "failed" and final["error"]["code"] == "model_unavailable"
        _wait_for_log(server, "answered nothing for 2 s: killing it")
        _wait_for_log(server, "exited (killed by SIGKILL, for answering nothing for 2 s)")
        assert check_response(_ask(server).json())["status"] in ("completed", "incomplete")
        assert _child(server) != first and not _alive(first)
    finally:
        server.kill()
