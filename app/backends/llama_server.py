"""llama.cpp's own server (``llama-server``) as the embedded models' engine.

One child process per loaded model, listening on a loopback port of its own. It does
what llama.cpp already does best, so this server does not do it again in Python:

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
  every decoding step would otherwise attend over (see ARCHITECTURE.md for what that
  costs here).
* **Persistence.** :meth:`LlamaServer.save_slots` writes every slot's state under
  ``slot_dir`` (at shutdown); :meth:`LlamaServer.restore_slots` loads them back at the next
  start, so a restarted server answers a known prefix from cache.

* **Supervision** (:class:`LlamaServer`): an exit nobody asked for is logged and the
  process started again; its output is copied to its log file, its errors to this
  server's log (:mod:`app.backends.server_log`); it answers only requests that carry the
  key it was started with.

This module knows the process and the wire format (``POST /completion``, streamed); the
backend (``local.py``) decides what to ask.

Contract of :meth:`LlamaServer.complete`: an async iterator of the server's stream chunks
(parsed JSON objects, the last one with ``stop: true``). Closing it closes the HTTP
response, which llama-server notices and cancels the generation, freeing the slot.
Connection and HTTP failures raise ``ModelError``; a 400 from llama-server (a bad grammar,
say) raises ``InvalidRequest``.

The client is aiohttp, as for the HTTP upstreams (:mod:`app.backends.upstream_http`):
llama-server sends one chunk per token, and httpx's pure-Python parsing took about 40% of
this process's CPU during a decode; that CPU is taken from the two cores the model
decodes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import json
import logging
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from app import jsontext
from app.backends import server_log
from app.backends.chat_stream import sse_events
from app.errors import InvalidRequest, ModelError, ModelUnavailable

log = logging.getLogger("ors.llama_server")

DEFAULT_CHUNK = 128
"""Prompt tokens per step beside running streams (``--batch-size`` and ``--ubatch-size``).
On 2 cores prompt evaluation ran at the same speed with chunks of 64, 128, 256 and 512
tokens (Qwen2.5-Coder 50-59 tokens/s, SmolLM2 178-203, alternating runs), while a running
stream waits for one whole chunk: 128 cuts that wait to a quarter of 512's."""

STARTUP_SECONDS = 300.0
"""How long a model may take to load (the first load of a large file is disk-bound)."""
OUTPUT_DRAIN_SECONDS = 2.0
"""How long an exit waits for the rest of the process's output before it says why."""
HANG_SECONDS = 120.0
"""How long a running llama-server may answer nothing before it is killed and started
again (``ORS_MODEL_HANG_SECONDS``)."""
RESTART_PAUSES = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Seconds before each try to start an exited llama-server again, after the first (which
is at once): one step further for each failure in a row, the last one repeated."""
STABLE_SECONDS = 60.0
"""A restarted llama-server that exits sooner after its start counts as a failure in a
row: a server that keeps crashing (a request it cannot survive, sent again and again) does
not restart without pause."""


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
            "--no-jinja",  # prompts arrive rendered, as token ids
        ]


class ServerState(enum.Enum):
    """Where a :class:`LlamaServer` is in its life."""

    STOPPED = "stopped"
    """Not started yet, or stopped by :meth:`LlamaServer.stop`."""
    STARTING = "starting"
    """The first start: the model is loading."""
    RUNNING = "running"
    RESTARTING = "restarting"
    """The process exited on its own; a new one is being started (after a pause)."""


class LlamaServer:
    """One model's llama-server, supervised. Start with :meth:`start`, stop with
    :meth:`stop`.

    Supervision, the contract:

    * The process is watched through a pidfd on the event loop (an event, not a poll):
      when it exits on its own (a crash, the kernel's out-of-memory killer, a signal from
      outside) its exit status and the last lines of its log are logged as an error, and
      a new one is started on a new port, with the same options. Its slots' saved state
      is restored again (``on_restart``).
    * Pauses before a restart: none after the first process, or one that ran
      :data:`STABLE_SECONDS` or more; else :data:`RESTART_PAUSES`, one step further for
      each failure in a row (a restarted process that exited that soon, or a start that
      failed): a crash once in a while costs a model load, a server that cannot start or
      keeps crashing does not spin.
    * Streams running when the process exits fail (their connection breaks: a
      ``ModelError``); nothing generated is lost that the client had not been sent.
    * A request that arrives while the model restarts after a single exit waits for that
      restart (:meth:`ready`) and then runs; a request whose connection broke before any
      answer is sent again once (:meth:`complete`). After a failure in a row, requests do
      not wait: they are ``503 model_unavailable`` with the last failure and a
      ``Retry-After`` of the pause left, until a start succeeds.
    * A process that is running but answers nothing for ``hang_seconds`` (a stuck loop,
      a stopped process) is killed, and so restarted (:meth:`_watch_for_hangs`).
    * :meth:`stop` ends all of it: a restart in progress is cancelled and its waiters fail.
    """

    def __init__(self, binary: Path, options: ServerOptions, log_path: Path,
                 on_restart: Callable[[], Awaitable[object]] | None = None,
                 hang_seconds: float = HANG_SECONDS) -> None:
        self.binary = binary
        self.hang_seconds = hang_seconds
        """A process that answers nothing for this long is killed, then started again
        (:meth:`_watch_for_hangs`); 0: never."""
        self.options = options
        self.log_path = log_path
        self.on_restart = on_restart
        """Run after each restart (not the first start), before waiting requests go on."""
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.state = ServerState.STOPPED
        self.restarts = 0
        """Restarts that succeeded."""
        self._client: aiohttp.ClientSession | None = None
        self._started_at = 0.0
        self._restarting: asyncio.Task[None] | None = None
        self._next_start: asyncio.Future[None] | None = None
        """The outcome of the restart under way, which requests wait for."""
        self._failure: ModelError | None = None
        """Why the last start failed, while restarts keep failing."""
        self._resume_at = 0.0
        """When the next start begins (the loop's clock), while restarts keep failing."""
        self._watch_fd: int | None = None
        self._pump: threading.Thread | None = None
        """The thread that copies the process's output (:func:`server_log.forward_output`)."""
        self._key = secrets.token_urlsafe(24)
        self._quick_exits = 0
        self._watchdog: asyncio.Task[None] | None = None
        self._hung = False
        """The current process was killed for not answering."""
        """Exits in a row of restarted processes that ran less than :data:`STABLE_SECONDS`."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """What a request to this server must carry: its key. llama-server is started with
        a key of its own (``LLAMA_API_KEY``, in its environment, which other users cannot
        read, not on its command line, which they can), so another local process cannot
        use the model, nor save or restore its slots, through its loopback port."""
        return {"Authorization": f"Bearer {self._key}"}

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Spawn the process and wait until its model is loaded (``/health`` is 200); from
        then on it is supervised (see the class)."""
        self.state = ServerState.STARTING
        try:
            await self._spawn()
        except BaseException:
            self.state = ServerState.STOPPED
            raise
        self.state = ServerState.RUNNING
        if self.hang_seconds > 0:
            self._watchdog = asyncio.create_task(self._watch_for_hangs(), name="llama-server-watchdog")

    async def _watch_for_hangs(self) -> None:
        """Every quarter of ``hang_seconds``, while the process runs, ask it for its metrics
        (``GET /metrics``), which its main loop answers between two steps of its batch (its
        ``/health`` is answered by another thread, so a stuck loop would pass it). One that
        has not answered within ``hang_seconds`` is stuck: every stream it holds would wait
        for ever, and every request after them. It is killed (SIGKILL), and the supervisor
        starts it again as after any exit. A step takes well under a second, a chunk of a
        long prompt a few: the default, :data:`HANG_SECONDS`, is far from both."""
        every = max(0.2, self.hang_seconds / 4)
        while True:
            await asyncio.sleep(every)
            process, client = self.process, self._client
            if self.state is not ServerState.RUNNING or process is None or client is None:
                continue
            try:
                async with client.get("/metrics", timeout=aiohttp.ClientTimeout(total=self.hang_seconds)) as reply:
                    await reply.read()
            except TimeoutError:
                if process is self.process and process.poll() is None:
                    log.error("llama-server for %s answered nothing for %.0f s: killing it, to start it again.",
                              self.options.model_path.name, self.hang_seconds)
                    self._hung = True
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            except aiohttp.ClientError:
                continue  # gone, or going: the exit is the supervisor's

    async def _spawn(self) -> None:
        """One process, loaded and watched; killed again if it could not load."""
        self.options.slot_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        arguments = self.options.arguments(self.binary, self.port)
        log.info("starting llama-server for %s on port %d", self.options.model_path.name, self.port)
        # OpenMP's default wait policy (spin briefly, then sleep) for the server's threads:
        # PASSIVE, right for a model sharing cores with this process, makes a separate
        # server decode three times slower here (32 against 92 tokens/s on SmolLM2).
        env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
        env["LLAMA_API_KEY"] = self._key
        server_log.mark_start(self.log_path, self.port)
        process = subprocess.Popen(  # noqa: S603 - our own binary and arguments
            arguments, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True, preexec_fn=_die_with_parent,
        )
        assert process.stdout is not None
        self._pump = threading.Thread(target=server_log.forward_output, args=(process.stdout, self.log_path,
                                                                    self.options.model_path.name),
                                      name="llama-server-output", daemon=True)
        self._pump.start()
        self.process = process
        self._started_at = time.monotonic()
        client = self._client = aiohttp.ClientSession(
            base_url=self.base_url,
            headers=self.headers,
            # a new loopback connection per request (about 0.1 ms, against seconds of
            # generation): aiohttp, unlike httpx, does not notice that llama-server closed
            # an idle kept-alive connection until it writes to it
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0),
        )
        try:
            deadline = asyncio.get_running_loop().time() + STARTUP_SECONDS
            while True:
                if process.poll() is not None:
                    await self._drained()
                    raise ModelError(f"llama-server exited while loading the model ({_exit_status(process)}):\n"
                                     f"{self._log_tail()}", code="model_unavailable")
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with client.get("/health", timeout=aiohttp.ClientTimeout(total=2.0)) as health:
                        if health.status == 200:
                            break
                if asyncio.get_running_loop().time() > deadline:
                    raise ModelError(f"llama-server did not load the model in {STARTUP_SECONDS:.0f} s",
                                     code="model_unavailable")
                await asyncio.sleep(0.05)
        except BaseException:
            await self._end_process()
            raise
        self._watch(process)

    def _watch(self, process: subprocess.Popen[bytes]) -> None:
        """Call :meth:`_exited` once ``process`` exits: its pidfd becomes readable."""
        try:
            fd = os.pidfd_open(process.pid)
        except (AttributeError, OSError):  # no pidfd (not Linux 5.3+): a thread waits instead
            loop = asyncio.get_running_loop()
            threading.Thread(target=lambda: (process.wait(), loop.call_soon_threadsafe(self._exited, process)),
                             name="llama-server-watch", daemon=True).start()
            return
        self._watch_fd = fd
        asyncio.get_running_loop().add_reader(fd, self._exited, process)

    def _unwatch(self) -> None:
        fd, self._watch_fd = self._watch_fd, None
        if fd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def _exited(self, process: subprocess.Popen[bytes]) -> None:
        """``process`` exited. Unless it was stopped (or a restart is under way, which
        finds out by itself), start it again. Idempotent: :meth:`ready` calls it too when
        it finds the process gone before its pidfd was read."""
        if process is not self.process:
            return
        self._unwatch()
        if self.state is not ServerState.RUNNING:
            return
        process.poll()
        ran = time.monotonic() - self._started_at
        self._quick_exits = self._quick_exits + 1 if self.restarts and ran < STABLE_SECONDS else 0
        status = _exit_status(process)
        if self._hung:
            status += f", for answering nothing for {self.hang_seconds:.0f} s"
            self._hung = False
        self.state = ServerState.RESTARTING
        self._failure = None if not self._quick_exits else ModelError(
            f"llama-server exited ({status}) {ran:.0f} s after it was started again "
            f"({self._quick_exits} such exit(s) in a row)",
            code="model_unavailable")
        self._next_start = asyncio.get_running_loop().create_future()
        self._restarting = asyncio.create_task(self._restart(self._quick_exits, f"({status}) after {ran:.0f} s"),
                                               name="llama-server-restart")

    async def _restart(self, failures: int, how: str) -> None:
        """Say how the process ended (``how``), with its last lines, then start again until
        a start succeeds, after ``failures`` (exits or starts that failed in a row) pauses'
        worth of waiting (see the class)."""
        await self._drained()
        log.error("llama-server for %s exited %s; starting it again. Its last lines:\n%s",
                  self.options.model_path.name, how, self._log_tail())
        loop = asyncio.get_running_loop()
        while True:
            if failures:
                pause = RESTART_PAUSES[min(failures, len(RESTART_PAUSES)) - 1]
                self._resume_at = loop.time() + pause
                await asyncio.sleep(pause)
            await self._close_client()
            try:
                await self._spawn()
                if self.on_restart is not None:
                    await self.on_restart()
            except ModelError as exc:
                failures += 1
                self._failure = exc
                pause = RESTART_PAUSES[min(failures, len(RESTART_PAUSES)) - 1]
                log.error("llama-server for %s could not start again (%d in a row); next try in %.0f s: %s",
                          self.options.model_path.name, failures, pause, exc.message)
                if self._next_start is not None and not self._next_start.done():
                    self._next_start.set_exception(ModelUnavailable(
                        f"The embedded model's server could not start again: {exc.message}",
                        retry_after=math.ceil(pause)))
                    self._next_start.exception()  # retrieved: nobody may be waiting
                self._next_start = loop.create_future()
                continue
            self._restarting = None
            self.state = ServerState.RUNNING
            self.restarts += 1
            self._failure = None
            log.warning("llama-server for %s is running again (restart %d).", self.options.model_path.name,
                        self.restarts)
            done, self._next_start = self._next_start, None
            if done is not None and not done.done():
                done.set_result(None)
            if self.process is not None and self.process.poll() is not None:
                self._exited(self.process)  # it died again meanwhile, unwatched
            return

    async def ready(self) -> aiohttp.ClientSession:
        """The client of the running process: at once while it runs, after the restart
        under way if the process exited once, else ``ModelUnavailable`` (see the class)."""
        process = self.process
        if self.state is ServerState.RUNNING and process is not None and process.poll() is not None:
            self._exited(process)  # gone before its pidfd was read
        if self.state is ServerState.RUNNING and self._client is not None:
            return self._client
        if self.state is ServerState.RESTARTING and self._next_start is not None:
            if self._failure is not None:
                wait = max(1, math.ceil(self._resume_at - asyncio.get_running_loop().time()))
                raise ModelUnavailable(
                    f"The embedded model's server is being started again, after a failure: {self._failure.message}",
                    retry_after=wait)
            await asyncio.shield(self._next_start)
            return await self.ready()
        raise ModelUnavailable(f"llama-server is not running:\n{self._log_tail()}")

    async def stop(self) -> None:
        """Stop supervising, then the process (SIGTERM, then SIGKILL after 5 s), and close
        the client. The process is killed even if this task is cancelled while it waits."""
        self.state = ServerState.STOPPED
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
        restarting, self._restarting = self._restarting, None
        if restarting is not None:
            restarting.cancel()
            with contextlib.suppress(asyncio.CancelledError, ModelError):
                await restarting
        waiting, self._next_start = self._next_start, None
        if waiting is not None and not waiting.done():
            waiting.set_exception(ModelUnavailable("The embedded model's server is stopping."))
            waiting.exception()
        await self._end_process()

    async def _end_process(self) -> None:
        self._unwatch()
        await self._close_client()
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, 5)
        except subprocess.TimeoutExpired:
            log.warning("llama-server did not stop within 5 s of SIGTERM: killed")
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()

    async def _drained(self) -> None:
        """Wait (a little) until the exited process's last output is in its log file."""
        pump = self._pump
        if pump is not None:
            await asyncio.to_thread(pump.join, OUTPUT_DRAIN_SECONDS)

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    # ------------------------------------------------------------ slots

    async def save_slots(self, names: Mapping[int, str]) -> list[int]:
        """Save the KV state of each slot ``i`` to ``slot_dir/names[i]``; the slots that
        held something and were saved."""
        saved = []
        for slot, name in names.items():
            reply = await self._slot_action(slot, "save", name)
            if reply is not None and int(reply.get("n_saved", 0)) > 0:
                saved.append(slot)
        return saved

    async def restore_slots(self, names: Mapping[int, str]) -> list[int]:
        """Restore the slot states saved under ``slot_dir/names[i]`` (a missing file is
        skipped); the slots that were restored."""
        restored = []
        for slot, name in names.items():
            if (self.options.slot_dir / name).is_file() and await self._slot_action(slot, "restore", name) is not None:
                restored.append(slot)
        return restored

    async def _slot_action(self, slot: int, action: str, name: str) -> dict[str, Any] | None:
        """``POST /slots/<slot>?action=...``: llama-server's answer, or None (logged) if it
        could not."""
        client = self._require_client()
        try:
            async with client.post(f"/slots/{slot}", params={"action": action}, json={"filename": name},
                                   timeout=aiohttp.ClientTimeout(total=120.0)) as reply:
                if reply.status != 200:
                    text = await reply.text(errors="replace")
                    log.warning("llama-server could not %s slot %d: %s", action, slot, text[:300])
                    return None
                answer = await reply.json(content_type=None)
                return answer if isinstance(answer, dict) else {}
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.warning("llama-server could not %s slot %d: %r", action, slot, exc)
            return None

    # ------------------------------------------------------------ generation

    async def complete(self, body: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream ``POST /completion``; see the module docstring.

        One retry, invisible to the caller: when the connection breaks before a single
        chunk arrived (a server that closed it under the request, or one that exited and is
        started again, see :meth:`ready`); nothing was generated, so nothing is repeated."""
        for attempt in (1, 2):
            client = await self.ready()
            received = False
            try:
                async with client.post("/completion", json={**body, "stream": True}) as reply:
                    if reply.status != 200:
                        raise _error(reply.status, (await reply.read()).decode(errors="replace"))
                    async with contextlib.aclosing(sse_events(reply.content.iter_any())) as events:
                        async for event, data in events:
                            received = True
                            if event == "error":
                                raise _error(500, data)
                            chunk = jsontext.loads(data)
                            if isinstance(chunk, dict) and "error" in chunk:
                                raise _error(500, json.dumps(chunk["error"]))
                            yield chunk
                            if chunk.get("stop"):
                                return
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError) as exc:
                if attempt == 1 and not received:
                    log.debug("retrying a request whose connection broke before any answer: %r", exc)
                    continue
                raise ModelError(f"The embedded model's server failed: {exc!r}", code="model_unavailable") from exc
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise ModelError(f"The embedded model's server failed: {exc!r}", code="model_unavailable") from exc
            raise ModelError("The embedded model's server ended the stream early.", code="model_stream_ended")

    def _require_client(self) -> aiohttp.ClientSession:
        if self._client is None or not self.running:
            raise ModelError(f"llama-server is not running:\n{self._log_tail()}", code="model_unavailable")
        return self._client

    def _log_tail(self, lines: int = 20) -> str:
        return server_log.tail(self.log_path, lines)


def _error(status: int, text: str) -> Exception:
    try:
        message = json.loads(text).get("error", {}).get("message", text)
    except (ValueError, AttributeError):
        message = text
    if status == 400:
        return InvalidRequest(f"The embedded model refused the request: {message}")
    return ModelError(f"The embedded model's server answered {status}: {message}", code="model_error")


def _exit_status(process: subprocess.Popen[bytes]) -> str:
    """How ``process`` ended, in words: ``exit code 1``, ``killed by SIGKILL``."""
    code = process.returncode
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


def _die_with_parent() -> None:
    """In the child, before exec: be killed when the process that started it dies (Linux
    ``PR_SET_PDEATHSIG``), so no server outlives an ors that was killed."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
