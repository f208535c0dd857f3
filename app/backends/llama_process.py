"""One llama-server child process: which binary, its command line, its start, how its
exit is seen, how it is ended.

What llama.cpp's server does for the embedded models, by the options it is started with
(:class:`ServerOptions`), so that this server does not do it again in Python:

* **Continuous batching.** ``--parallel N`` slots share one batch per decode step; a new
  request joins at once, and a long prompt is evaluated in chunks of ``--ubatch-size``
  interleaved with the running streams' decoding.
* **One KV cache for all slots** (``--kv-unified``): any one sequence may use the whole
  context window; the slots together share it.
* **A prompt cache that outlives requests.** A slot keeps its KV state after its request
  ends, and when a request starts every idle slot's state moves into a host-memory cache
  (``--cache-ram`` MiB, least recently used out; ``--cache-idle-slots``, the default with
  a unified KV cache), from which the slot a new request takes loads the longest
  matching prefix. Idle slots emptied so keep no cells of the shared KV cache, which
  every decoding step would otherwise attend over.
* **Slot files** (``--slot-save-path``): each slot's state can be saved and restored.

The process (:class:`Child`) listens on 127.0.0.1 only, answers only requests that carry
the key in its environment, dies with this server (``PR_SET_PDEATHSIG``), and has its
output copied to its log file (:mod:`app.backends.server_log`). Its exit is an event on
the event loop (a pidfd), not a poll. What to do about an exit is the supervisor's
(:mod:`app.backends.llama_server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.backends import server_log
from app.errors import ModelError

log = logging.getLogger("ors.llama_server")

DEFAULT_CHUNK = 128
"""Prompt tokens per step beside running streams (``--batch-size`` and ``--ubatch-size``):
a running stream waits for one whole chunk, and larger chunks do not evaluate a prompt
faster on a small CPU (see ARCHITECTURE.md)."""
OUTPUT_DRAIN_SECONDS = 2.0
"""How long an exit waits for the rest of the process's output before it says why."""
STOP_SECONDS = 5.0
"""How long :meth:`Child.end` waits after SIGTERM before SIGKILL."""


def find_binary(configured: str | None = None) -> Path:
    """The llama-server executable: ``configured``, else the one installed beside this
    Python (``make install`` puts it there), else the first on ``PATH``."""
    candidates = [configured] if configured else [str(Path(sys.prefix) / "bin" / "llama-server"), "llama-server"]
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return Path(found)
    raise ModelError(
        "llama-server, which runs the embedded models, is not installed: run `make install` "
        "(it builds llama.cpp's server), or set ORS_LLAMA_SERVER to its path.",
        code="model_unavailable",
    )


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How one model's llama-server runs."""

    model_path: Path
    context: int
    """Tokens of KV cache, shared by all slots (and the most one sequence may use)."""
    parallel: int
    threads: int
    cache_ram_mib: int
    slot_dir: Path
    kv_type: str = "f16"
    """``f16``, or a quantized type (``q8_0``) that halves the KV cache's memory."""
    batch: int = DEFAULT_CHUNK
    """Prompt tokens per chunk, interleaved with the other slots' decoding (both
    ``--batch-size`` and ``--ubatch-size``: a larger logical batch would still hold the
    running streams for all of it)."""
    chat: bool = False
    """Whether the server renders and reads chats itself (its ``/v1/chat/completions``:
    the model's Jinja template, and llama.cpp's parsers of each model family's tool calls
    and ``<think>`` reasoning, returned as ``reasoning_content``); otherwise prompts
    arrive rendered, as token ids, and its Jinja engine is off."""
    chat_template_file: Path | None = None
    """A template that replaces the GGUF's own (chat mode)."""
    defaults: tuple[str, ...] = ()
    """Flags of the model's default sampling and answer length (chat mode: a request that
    sets none gets them from the server)."""

    def arguments(self, binary: Path, port: int) -> list[str]:
        return [
            str(binary),
            "--model", str(self.model_path),
            "--host", "127.0.0.1",
            "--port", str(port),
            "--ctx-size", str(self.context),
            "--parallel", str(self.parallel),
            "--kv-unified",
            "--cont-batching",
            "--threads", str(self.threads),
            "--threads-batch", str(self.threads),
            "--batch-size", str(self.batch),
            "--ubatch-size", str(self.batch),
            "--cache-ram", str(self.cache_ram_mib),
            "--cache-type-k", self.kv_type,
            "--cache-type-v", self.kv_type,
            "--slot-save-path", str(self.slot_dir),
            "--no-webui",
            "--no-warmup",  # an empty run at start: seconds per start, nothing for the first request
            "--metrics",
            *(self._chat_arguments() if self.chat else ["--no-jinja"]),  # else prompts arrive as token ids
        ]

    def _chat_arguments(self) -> list[str]:
        template = ["--chat-template-file", str(self.chat_template_file)] if self.chat_template_file else []
        return ["--jinja", "--reasoning-format", "deepseek", *template, *self.defaults]


class Child:
    """One llama-server process, started by the constructor on a free loopback port."""

    def __init__(self, binary: Path, options: ServerOptions, log_path: Path, key: str) -> None:
        options.slot_dir.mkdir(parents=True, exist_ok=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log_path = log_path
        name = options.model_path.name
        log.info("starting llama-server for %s on port %d", name, self.port)
        # OpenMP's default wait policy (spin briefly, then sleep) for the server's threads:
        # PASSIVE, right for a model sharing cores with this process, makes a separate
        # server decode several times slower.
        env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
        env["LLAMA_API_KEY"] = key
        server_log.mark_start(log_path, self.port)
        self.process = subprocess.Popen(  # noqa: S603 - our own binary and arguments
            options.arguments(binary, self.port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=env, start_new_session=True, preexec_fn=_die_with_parent,
        )
        assert self.process.stdout is not None
        self._pump = threading.Thread(target=server_log.forward_output, args=(self.process.stdout, log_path, name),
                                      name="llama-server-output", daemon=True)
        self._pump.start()
        self.started_at = time.monotonic()
        self._watch_fd: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def exit_status(self) -> str:
        """How the process ended, in words: ``exit code 1``, ``killed by SIGKILL``."""
        code = self.process.poll()
        if code is None:
            return "still running"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
            return f"killed by signal {-code}"
        return f"exit code {code}"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def watch(self, exited: Callable[[], object]) -> None:
        """Call ``exited`` on the running loop once the process exits: its pidfd becomes
        readable (without pidfds, before Linux 5.3, a thread waits instead)."""
        loop = asyncio.get_running_loop()
        try:
            fd = os.pidfd_open(self.process.pid)
        except (AttributeError, OSError):
            threading.Thread(target=lambda: (self.process.wait(), loop.call_soon_threadsafe(exited)),
                             name="llama-server-watch", daemon=True).start()
            return
        self._watch_fd = fd
        loop.add_reader(fd, exited)

    def unwatch(self) -> None:
        fd, self._watch_fd = self._watch_fd, None
        if fd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    async def drained(self) -> None:
        """Wait (a little) until the exited process's last output is in its log file."""
        await asyncio.to_thread(self._pump.join, OUTPUT_DRAIN_SECONDS)

    def log_tail(self, lines: int = 20) -> str:
        return server_log.tail(self.log_path, lines)

    async def end(self) -> None:
        """Stop watching, then the process: SIGTERM, then SIGKILL after :data:`STOP_SECONDS`.
        The process is killed even if this task is cancelled while it waits."""
        self.unwatch()
        process = self.process
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, STOP_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("llama-server did not stop within %.0f s of SIGTERM: killed", STOP_SECONDS)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def _die_with_parent() -> None:
    """In the child, before exec: be killed when the process that started it dies (Linux
    ``PR_SET_PDEATHSIG``), so no server outlives an ors that was killed."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
