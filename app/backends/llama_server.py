"""One embedded model's llama-server, supervised: started, watched, started again.

The child process itself (its command line, its start, its exit) is
:mod:`app.backends.llama_process`'s; the HTTP requests to it are
:mod:`app.backends.llama_client`'s; what to ask is the backend's (``local.py``). This
module decides when the process runs and who may use it (:class:`LlamaServer`): it
starts one, waits until its model is loaded, starts it again after an exit nobody asked
for or a hang, and makes requests wait for (or fail fast during) a restart.

* **Persistence.** :meth:`LlamaServer.save_slots` writes every slot's state under
  ``slot_dir`` (at shutdown); :meth:`LlamaServer.restore_slots` loads them back at the next
  start, so a restarted server answers a known prefix from cache.
* **A key of its own.** Each server is started with a random key that every request
  carries, so another local process cannot use the model, nor save or restore its
  slots, through its loopback port.

Contract of :meth:`LlamaServer.complete`: an async iterator of the server's stream chunks
(parsed JSON objects, the last one with ``stop: true``). Closing it closes the HTTP
response, which llama-server notices and cancels the generation, freeing the slot.
Connection and HTTP failures raise ``ModelError``; a 400 from llama-server (a bad grammar,
say) raises ``InvalidRequest``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from app.backends import server_log
from app.backends.llama_client import LlamaClient, Unanswered
from app.backends.llama_process import Child, ServerOptions
from app.errors import ModelError, ModelUnavailable

log = logging.getLogger("ors.llama_server")

STARTUP_SECONDS = 300.0
"""How long a model may take to load (the first load of a large file is disk-bound)."""
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
        self.process: Child | None = None
        self.state = ServerState.STOPPED
        self.restarts = 0
        """Restarts that succeeded."""
        self._client: LlamaClient | None = None
        self._restarting: asyncio.Task[None] | None = None
        self._next_start: asyncio.Future[None] | None = None
        """The outcome of the restart under way, which requests wait for."""
        self._failure: ModelError | None = None
        """Why the last start failed, while restarts keep failing."""
        self._resume_at = 0.0
        """When the next start begins (the loop's clock), while restarts keep failing."""
        self._key = secrets.token_urlsafe(24)
        self._quick_exits = 0
        """Exits in a row of restarted processes that ran less than :data:`STABLE_SECONDS`."""
        self._watchdog: asyncio.Task[None] | None = None
        self._hung = False
        """The current process was killed for not answering."""

    @property
    def port(self) -> int:
        return self.process.port if self.process is not None else 0

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
        return self.process is not None and self.process.running

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
            # None: gone, or going; the exit is the supervisor's
            if await client.responsive(self.hang_seconds) is False and process is self.process and process.running:
                log.error("llama-server for %s answered nothing for %.0f s: killing it, to start it again.",
                          self.options.model_path.name, self.hang_seconds)
                self._hung = True
                process.kill()

    async def _spawn(self) -> None:
        """One process, loaded and watched; ended again if it could not load."""
        process = self.process = Child(self.binary, self.options, self.log_path, self._key)
        client = self._client = LlamaClient(self.base_url, self._key)
        try:
            deadline = asyncio.get_running_loop().time() + STARTUP_SECONDS
            while True:
                if not process.running:
                    await process.drained()
                    raise ModelError(f"llama-server exited while loading the model ({process.exit_status()}):\n"
                                     f"{self._log_tail()}", code="model_unavailable")
                if await client.healthy(timeout=2.0):
                    break
                if asyncio.get_running_loop().time() > deadline:
                    raise ModelError(f"llama-server did not load the model in {STARTUP_SECONDS:.0f} s",
                                     code="model_unavailable")
                await asyncio.sleep(0.05)
        except BaseException:
            await self._end_process()
            raise
        process.watch(lambda: self._exited(process))

    def _exited(self, process: Child) -> None:
        """``process`` exited. Unless it was stopped (or a restart is under way, which
        finds out by itself), start it again. Idempotent: :meth:`ready` calls it too when
        it finds the process gone before its pidfd was read."""
        process.unwatch()
        if process is not self.process:
            return
        if self.state is not ServerState.RUNNING:
            return
        ran = time.monotonic() - process.started_at
        self._quick_exits = self._quick_exits + 1 if self.restarts and ran < STABLE_SECONDS else 0
        status = process.exit_status()
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
            if self.process is not None and not self.process.running:
                self._exited(self.process)  # it died again meanwhile, unwatched
            return

    async def ready(self) -> LlamaClient:
        """The client of the running process: at once while it runs, after the restart
        under way if the process exited once, else ``ModelUnavailable`` (see the class)."""
        process = self.process
        if self.state is ServerState.RUNNING and process is not None and not process.running:
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
        await self._close_client()
        process, self.process = self.process, None
        if process is not None:
            await process.end()

    async def _drained(self) -> None:
        """Wait (a little) until the exited process's last output is in its log file."""
        if self.process is not None:
            await self.process.drained()

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

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
        return await self._require_client().slot_action(slot, action, name)

    # ------------------------------------------------------------ generation

    async def complete(self, body: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream ``POST /completion``; see the module docstring.

        One retry, invisible to the caller: when the connection breaks before a single
        chunk arrived (a server that closed it under the request, or one that exited and is
        started again, see :meth:`ready`); nothing was generated, so nothing is repeated."""
        for attempt in (1, 2):
            client = await self.ready()
            try:
                async with contextlib.aclosing(client.completion(body)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                return
            except Unanswered as exc:
                if attempt == 1:
                    log.debug("retrying a request whose connection broke before any answer: %s", exc)
                    continue
                raise ModelError(f"The embedded model's server failed: {exc}", code="model_unavailable") from exc

    def _require_client(self) -> LlamaClient:
        if self._client is None or not self.running:
            raise ModelError(f"llama-server is not running:\n{self._log_tail()}", code="model_unavailable")
        return self._client

    def _log_tail(self, lines: int = 20) -> str:
        return server_log.tail(self.log_path, lines)


