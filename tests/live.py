"""Real servers for end-to-end tests: uvicorn on 127.0.0.1, a random port, real sockets.

The in-process ASGI transport buffers whole responses and hides streaming bugs, so
end-to-end tests always go through a listening socket.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from app.serve import Server, transport_options


class LiveServer:
    """Runs ``app`` with uvicorn in a background thread until :meth:`stop`."""

    def __init__(self, app: FastAPI, *, graceful_seconds: float = 5) -> None:
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=graceful_seconds,
            **transport_options(app.state.settings),
        )
        self.server = Server(config, app.state.drain)
        self.thread = threading.Thread(target=self.server.run, name="live-server", daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread died during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not start")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """What SIGTERM does: drain open streams, then stop."""
        self.server.handle_exit(signal.SIGTERM, None)
        self.thread.join(timeout=30)


def serve_in_front(data: Path, upstreams: str, *, default_model: str, backends: Sequence[Any] = ()) -> LiveServer:
    """A real server in front of the upstreams of ``upstreams`` (the config file's TOML,
    written to ``data/ors.toml``), storing in ``data``; started."""
    from app.config import Settings
    from app.main import create_app

    config = data / "ors.toml"
    config.write_text(upstreams)
    settings = Settings(data_dir=data, default_model=default_model, config=config)
    return LiveServer(create_app(settings, backends=list(backends))).start()


@contextlib.contextmanager
def live_server(app: FastAPI) -> Iterator[LiveServer]:
    server = LiveServer(app).start()
    try:
        yield server
    finally:
        server.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``ors serve`` as a real child process (what a user runs)."""

    def __init__(self, env: Mapping[str, str], data_dir: Path, *, port: int | None = None,
                 host: str = "127.0.0.1", new_session: bool = False) -> None:
        self.host = host
        self.new_session = new_session
        """Start it in a session (and process group) of its own, as a terminal does."""
        self.port = port or free_port()
        self.env = {**os.environ, **env, "ORS_DATA_DIR": str(data_dir)}
        self.log_path = data_dir / f"server-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        command = [sys.executable, "-m", "app.cli", "serve", "--host", self.host, "--port", str(self.port)]
        self.process = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=self.new_session)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        self.kill()
        raise TimeoutError(f"server did not become healthy:\n{self.log_path.read_text()}")

    def terminate(self, timeout: float = 30) -> int:
        assert self.process is not None
        self.process.terminate()
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_for(condition: Callable[[], bool], timeout: float = 30) -> bool:
    """Whether ``condition()`` came true within ``timeout`` seconds, asked every 20 ms: a
    bound on how long to wait for what another thread or process does, not a measurement."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False
