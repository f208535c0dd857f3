"""SQLite's one writer, in a process of its own: group commit beside the event loop.

Why a process. SQLite's driver lets go of the GIL for every step of a statement and
then waits to take it back; while the event loop is busy, each of those waits lasts
until the loop's next pause. When the writer was a thread of the server, a batch of
about eight writes at concurrency 16 held its transaction 6-7 ms for 1.1 ms of the
thread's CPU, and every microsecond of the writer's Python (building parameters,
serializing JSON, compressing events) was taken from requests, since both shared one
GIL. In a process of its own the writer has its own GIL and, on a machine of two cores
or more, a core of its own (see ARCHITECTURE.md for what it measured).

The contract of :mod:`app.store.group_commit` holds unchanged: a write is delivered
once the transaction that ran it has committed (flushed unless ``flush=False``); a
batch takes every write waiting, in arrival order; a write that raises fails alone; a
caller that is cancelled does not cancel its write; ``close`` lets every write sent
finish first.

How. A write is a picklable function of a SQLAlchemy ``Connection`` (a module-level
function, or a ``functools.partial`` of one with plain arguments). The server sends it
over a Unix socket pair, in a frame ``(length, sequence number, flush)`` + pickle (a
partial as its function's name and its arguments: :func:`wire_form`); the
writer takes every frame waiting, runs them in one transaction (:class:`Committer`), and
answers with one frame per batch: each write's sequence number and its pickled result
or exception. On the server's side the socket is an asyncio transport: sending never
blocks the loop, and answers arrive as events, with no thread in between.

Lifetimes. The writer ends when the server's end of the socket closes (after it has
answered every write received): at :meth:`WriterProcess.close`, or when the server dies
in any way, ``kill -9`` included (then it drops the writes it has not begun: nobody
waits for them, and the next server's recovery may already have run). It ignores SIGINT
and SIGTERM, which a terminal or a supervisor sends to the whole process group: the server decides when writing stops.
If the writer dies, the writes waiting for it fail (their outcome is unknown: the
transaction may or may not have committed) and the next write starts a new writer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import logging
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from types import FunctionType
from typing import Any, TypeVar

from sqlalchemy.engine import URL, Connection, make_url

from app.errors import ServerError
from app.store.group_commit import CHECKPOINT_EVERY
from app.store.schema import Serialized

log = logging.getLogger("ors.store")

T = TypeVar("T")
Work = Callable[[Connection], Any]

MAX_BATCH = 128
_REQUEST = struct.Struct("!IQ?")
"""A write's frame header: the length of what follows it (the pickled write), its
sequence number, and whether its commit must be flushed."""
_LENGTH = struct.Struct("!I")
"""An answer's frame header: the length of the pickled batch of outcomes."""
_CHUNK = 256 * 1024


class WriterStopped(ServerError):
    """The writer process ended while a write waited for it: whether that write
    committed is unknown."""


# -- the server's side -------------------------------------------------------------------


class WriterProcess:
    """The store's writes, run by a writer process (see the module's contract)."""

    beside_loop = True

    def __init__(self, url: URL, *, max_batch: int = MAX_BATCH) -> None:
        self._url = url.render_as_string(hide_password=False)
        self._max_batch = max_batch
        self._loop = asyncio.get_running_loop()
        self._channel: _Channel | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._starting: asyncio.Lock = asyncio.Lock()
        self._sequence = 0
        self._open = True
        self.batches = 0
        """Transactions committed (for tests and benchmarks: writes per commit)."""
        self.checkpoints = 0
        """Checkpoints run (for tests)."""

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        """Start the writer (the first write would, too)."""
        await self._channel_ready()

    async def run(self, work: Callable[[Connection], T], *, flush: bool = True, single: bool = False) -> T:
        if not self._open:
            raise RuntimeError("the store is closed")
        channel = self._channel
        if channel is not None and not channel.lost.done():
            done = self._send(channel, work, flush)
        else:  # a writer to start first: the caller's cancellation does not stop the write
            done = asyncio.ensure_future(self._start_then_send(work, flush))
        return await asyncio.shield(done)  # type: ignore[no-any-return]

    async def _start_then_send(self, work: Work, flush: bool) -> Any:
        return await self._send(await self._channel_ready(), work, flush)

    def _send(self, channel: _Channel, work: Work, flush: bool) -> asyncio.Future[Any]:
        self._sequence += 1
        return channel.send(self._sequence, work, flush)

    async def close(self) -> None:
        """Let every write sent finish, then stop the writer and wait for it to exit."""
        if not self._open:
            return
        self._open = False
        async with self._starting:
            channel, self._channel = self._channel, None
            process, self._process = self._process, None
        if channel is not None:
            await channel.close()
        if process is not None:
            await asyncio.to_thread(_reap, process)

    async def _channel_ready(self) -> _Channel:
        channel = self._channel
        if channel is not None and not channel.lost.done():
            return channel
        async with self._starting:
            if self._channel is not None and not self._channel.lost.done():
                return self._channel
            if not self._open:
                raise RuntimeError("the store is closed")
            if self._process is not None:  # it died: take its exit status, start another
                await asyncio.to_thread(_reap, self._process)
                log.error("The store's writer process ended unexpectedly; starting a new one.")
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self._process = await asyncio.to_thread(self._spawn, theirs)
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            _, channel = await self._loop.create_unix_connection(lambda: _Channel(self), sock=ours)
            await asyncio.wait([channel.ready, channel.lost], return_when=asyncio.FIRST_COMPLETED)
            if not channel.ready.done():
                raise WriterStopped("The store's writer process ended as it started; see its log above.")
            self._channel = channel
            return channel

    def _spawn(self, theirs: socket.socket) -> subprocess.Popen[bytes]:
        fd = theirs.fileno()
        command = [sys.executable, "-m", __name__, "--fd", str(fd), "--max-batch", str(self._max_batch),
                   "--url", self._url]
        return subprocess.Popen(command, pass_fds=(fd,), stdin=subprocess.DEVNULL)

    def _counted(self, batches: int, checkpoints: int) -> None:
        self.batches, self.checkpoints = batches, checkpoints


def _reap(process: subprocess.Popen[bytes]) -> None:
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        log.error("The store's writer process did not stop within 60 s; killing it.")
        process.kill()
        process.wait()


class _Channel(asyncio.Protocol):
    """The server's end of the socket: frames out, answers in, one future per write."""

    def __init__(self, owner: WriterProcess) -> None:
        self._owner = owner
        self._transport: asyncio.Transport | None = None
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._buffer = bytearray()
        self._outgoing: list[bytes] = []
        self.lost: asyncio.Future[None] = owner._loop.create_future()
        self.ready: asyncio.Future[None] = owner._loop.create_future()
        """Set by the writer's first answer, which it sends once it can write."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def send(self, sequence: int, work: Work, flush: bool) -> asyncio.Future[Any]:
        """Queue a write's frame; the frames queued in one turn of the loop leave
        together at its end (one system call, and the writer wakes once for them)."""
        body = pickle.dumps(wire_form(work), pickle.HIGHEST_PROTOCOL)
        done: asyncio.Future[Any] = self._owner._loop.create_future()
        self._waiting[sequence] = done
        if not self._outgoing:
            self._owner._loop.call_soon(self._send_outgoing)
        self._outgoing.append(_REQUEST.pack(len(body), sequence, flush))
        self._outgoing.append(body)
        return done

    def _send_outgoing(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        if outgoing and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(outgoing))

    async def close(self) -> None:
        """No more writes: the writer answers those it has, then ends (EOF)."""
        if self._transport is not None and not self.lost.done():
            self._send_outgoing()
            self._transport.write_eof()
        await self.lost

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        while len(buffer) - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(buffer, start)
            end = start + _LENGTH.size + length
            if len(buffer) < end:
                break
            batches, checkpoints, outcomes = pickle.loads(buffer[start + _LENGTH.size : end])
            start = end
            self._owner._counted(batches, checkpoints)
            if not self.ready.done():
                self.ready.set_result(None)
            for sequence, ok, payload in outcomes:
                done = self._waiting.pop(sequence, None)
                if done is not None:
                    _settle(done, ok, payload)
        if start:
            del buffer[:start]

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, error: Exception | None) -> None:
        waiting, self._waiting = self._waiting, {}
        for done in waiting.values():
            if not done.done():
                done.set_exception(WriterStopped("The store's writer stopped before it answered this write."))
                done.exception()  # a caller that went away never retrieves it
        if not self.lost.done():
            self.lost.set_result(None)


def _settle(done: asyncio.Future[Any], ok: bool, payload: bytes) -> None:
    if done.done():
        return
    try:
        value = pickle.loads(payload)
    except Exception as error:  # noqa: BLE001 - an outcome this process cannot rebuild
        ok, value = False, ServerError(f"The store's writer answered with what cannot be read here: {error!r}")
    if ok:
        done.set_result(value)
    else:
        done.set_exception(value)
        done.exception()  # a caller that went away never retrieves it


# -- a write on the wire ----------------------------------------------------------------

_PLAIN, _SERIALIZED, _PARTIAL = 0, 1, 2
_NAMES: dict[FunctionType, str] = {}
_FUNCTIONS: dict[str, Callable[..., Any]] = {}


def wire_form(work: Work) -> Any:
    """``work`` as plain data for pickle: a ``functools.partial`` of a module-level
    function (every write of the store) becomes ``(name, arguments, kinds, keywords)``,
    a :class:`~app.store.schema.Serialized` argument its text and status, a partial
    argument (an events packer) the same form again; anything else is sent as it is.

    Why: pickle saves a partial through reducers (its class, its function by name, its
    state) and a ``Serialized`` through a Python ``__reduce__``. A stored stream's two
    writes took 8.5 µs to pickle so, the same data plain 3.2 µs."""
    if type(work) is not functools.partial or type(work.func) is not FunctionType:
        return work
    func = work.func
    name = _NAMES.get(func)
    if name is None:
        name = f"{func.__module__}:{func.__qualname__}"
        try:
            found = _function(name)
        except (ImportError, AttributeError):
            found = None
        if found is not func:  # not found by its name (a nested function): pickle says why it cannot be sent
            return work
        _NAMES[func] = name
    arguments = []
    kinds = []
    for argument in work.args:
        kind = type(argument)
        if kind is Serialized:
            arguments.append((str(argument), argument.status))
            kinds.append(_SERIALIZED)
        elif kind is functools.partial:
            form = wire_form(argument)
            arguments.append(form)
            kinds.append(_PLAIN if form is argument else _PARTIAL)
        else:
            arguments.append(argument)
            kinds.append(_PLAIN)
    return name, arguments, bytes(kinds), work.keywords or None


def from_wire(form: Any) -> Work:
    """The write :func:`wire_form` sent."""
    if type(form) is not tuple:
        return form  # type: ignore[no-any-return]
    name, arguments, kinds, keywords = form
    for index, kind in enumerate(kinds):
        if kind == _SERIALIZED:
            arguments[index] = Serialized(*arguments[index])
        elif kind == _PARTIAL:
            arguments[index] = from_wire(arguments[index])
    return functools.partial(_function(name), *arguments, **(keywords or {}))


def _function(name: str) -> Callable[..., Any]:
    function = _FUNCTIONS.get(name)
    if function is None:
        module, _, qualname = name.partition(":")
        function = importlib.import_module(module)
        for part in qualname.split("."):
            function = getattr(function, part)
        _FUNCTIONS[name] = function
    return function


# -- the writer's side -------------------------------------------------------------------


class Committer:
    """Runs batches of writes in transactions of a :class:`~app.store.database.SqliteDatabase`
    and checkpoints between them (see :mod:`app.store.group_commit`)."""

    def __init__(self, database: Any) -> None:
        self._database = database
        self.batches = 0
        self.checkpoints = 0
        self._checkpointed_at = 0

    def commit(self, batch: list[tuple[Work, bool]]) -> list[tuple[bool, Any]]:
        """Each write's ``(ok, result or exception)``, in order."""
        try:
            results = self._database.transaction(lambda connection: [work(connection) for work, _ in batch],
                                                 flush=any(flush for _, flush in batch))  # flushed if any must be
        except Exception as error:
            if len(batch) == 1:
                return [(False, error)]
            # one by one: only the failing write fails
            return [outcome for write in batch for outcome in self.commit([write])]
        self.batches += 1
        return [(True, result) for result in results]

    def maybe_checkpoint(self, idle: bool) -> None:
        """After :data:`CHECKPOINT_EVERY` transactions when no write waits (``idle``), or
        after four times as many regardless."""
        since = self.batches - self._checkpointed_at
        if since >= CHECKPOINT_EVERY and (idle or since >= 4 * CHECKPOINT_EVERY):
            self._checkpointed_at = self.batches
            try:
                self._database.checkpoint()
                self.checkpoints += 1
            except Exception:  # noqa: BLE001 - the next one will try again; commits go on
                log.exception("a checkpoint of the store failed")


class _Requests:
    """The writer's end of the socket: frames in (blocking for the first), answers out."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._frames: list[tuple[int, bool, bytes]] = []
        self.ended = False

    def take(self, limit: int) -> list[tuple[int, bool, bytes]]:
        """Up to ``limit`` writes: every one waiting, after blocking for the first."""
        while not self._frames and not self.ended:
            self._receive(block=True)
        if len(self._frames) < limit and not self.ended:
            self._receive(block=False)
        taken, self._frames = self._frames[:limit], self._frames[limit:]
        return taken

    @property
    def idle(self) -> bool:
        if self._frames or self.ended:
            return not self._frames
        readable, _, _ = select.select([self._sock], [], [], 0)
        return not readable

    def answer(self, body: bytes) -> None:
        self._sock.sendall(_LENGTH.pack(len(body)) + body)

    def _receive(self, *, block: bool) -> None:
        while True:
            try:
                data = self._sock.recv(_CHUNK, 0 if block else socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            if not data:
                self.ended = True
                return
            self._buffer += data
            self._parse()
            if block or len(data) < _CHUNK:
                return

    def _parse(self) -> None:
        buffer, start = self._buffer, 0
        while len(buffer) - start >= _REQUEST.size:
            length, sequence, flush = _REQUEST.unpack_from(buffer, start)
            end = start + _REQUEST.size + length
            if len(buffer) < end:
                break
            self._frames.append((sequence, flush, bytes(buffer[start + _REQUEST.size : end])))
            start = end
        if start:
            del buffer[:start]


def serve(sock: socket.socket, url: str, max_batch: int) -> None:
    """The writer's loop: take the writes waiting, commit them, answer; until EOF."""
    import app.store.statements  # noqa: F401 - the store's writes are its functions: imported before the first
    from app.store.database import SqliteDatabase

    database = SqliteDatabase(make_url(url))
    committer = Committer(database)
    requests = _Requests(sock)
    server = os.getppid()
    try:
        requests.answer(pickle.dumps((0, 0, [])))  # ready
        while True:
            frames = requests.take(max_batch)
            if not frames:
                return
            if requests.ended and os.getppid() != server:
                # the server died: nobody waits for these, and the next server's
                # recovery may already have run (a response begun now would stay
                # in_progress); what it sent before is committed or not, as in a crash
                log.warning("The server ended without closing the store; %d write(s) not made.", len(frames))
                return
            batch: list[tuple[Work, bool]] = []
            ready: list[tuple[int, tuple[bool, Any]]] = []
            runnable: list[int] = []
            for sequence, flush, body in frames:
                try:
                    batch.append((from_wire(pickle.loads(body)), flush))
                    runnable.append(sequence)
                except Exception as error:  # noqa: BLE001 - that write fails alone
                    ready.append((sequence, (False, ServerError(f"The store's writer cannot read a write: {error!r}"))))
            if batch:
                ready += zip(runnable, committer.commit(batch), strict=True)
            requests.answer(pickle.dumps(
                (committer.batches, committer.checkpoints,
                 [(sequence, *_portable(ok, value)) for sequence, (ok, value) in ready]),
                pickle.HIGHEST_PROTOCOL))
            committer.maybe_checkpoint(requests.idle)
    finally:
        database.close_writer()


def _portable(ok: bool, value: Any) -> tuple[bool, bytes]:
    """An outcome as the server can read it: pickled, or as a server error saying what it was."""
    try:
        return ok, pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001
        return False, pickle.dumps(ServerError(f"The store's writer cannot send back {value!r}"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fd", type=int, required=True, help="the writer's end of the socket pair")
    parser.add_argument("--url", required=True, help="the SQLite database's SQLAlchemy URL")
    parser.add_argument("--max-batch", type=int, default=MAX_BATCH)
    args = parser.parse_args(argv)
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s (writer): %(message)s")
    sock = socket.socket(fileno=args.fd)
    with contextlib.closing(sock):
        serve(sock, args.url, args.max_batch)
    os._exit(0)  # nothing left to run; skip the interpreter's slow teardown


if __name__ == "__main__":
    main()
