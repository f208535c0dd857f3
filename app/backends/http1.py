"""A small HTTP/1.1 client for one upstream: kept-alive connections, answers read as
they arrive. The HTTP upstream adapters (:mod:`app.backends.upstream_http`) send every
request through it.

Why not a general client: counted with callgrind in front of the benchmark's stub, one
streamed request through aiohttp (session, request and response objects, a task that
writes the body, a timeout moved on every read) cost about 400,000 instructions of the
server's process, a sixth of everything ors did for a ``store: false`` stream. What an
upstream call needs is narrow: one origin, a ``POST`` (or a ``GET`` of the model list)
with a known body, an answer read as it comes. So this module holds only that, on parts
the field keeps: asyncio's transports (TLS from the standard library for ``https``) and
llhttp, through httptools (the parser uvicorn serves with), for the status line, the
headers, sized, chunked and until-close bodies and keep-alive. ARCHITECTURE.md ("The
upstream client") has the figures.

The contract:

* :meth:`Client.request` is an async context manager; its value is the
  :class:`Connection` the request went out on, once the answer's head has arrived:
  ``status``, ``headers`` (lower-case names) and :meth:`Connection.chunks`, the body as
  it comes (what is buffered when the reader asks, joined).
* A connection serves one request at a time. It goes back to the pool only when its
  answer was read to its end and both sides keep it alive; a block left earlier (an
  error, a client that went away, a cancelled task) closes it, which is what tells an
  upstream to stop generating.
* The pool has no limit (every response in flight holds its own connection; see
  ``upstream_http.KEEPALIVE_SECONDS``). A connection idle for ``keepalive`` seconds is
  closed when it is next looked at, and one whose peer closed is never reused. A pooled
  connection closed by the upstream just as a request went out fails with
  :class:`Disconnected` before any byte of an answer: the adapters retry once on that.
* Timeouts: ``connect`` bounds opening a connection (TCP and TLS); ``read`` bounds the
  silence while an answer is awaited (one timer per request, moved on only when it
  fires). A reader that falls behind pauses the socket above :data:`HIGH_WATER` bytes
  waiting, and its silence is not the upstream's.
* Failures are :class:`UpstreamHttpError`\\ s: :class:`ConnectFailed`,
  :class:`ReadTimeout`, :class:`Disconnected` (the connection ended or the body broke
  before the answer's end) and :class:`Malformed` (no HTTP answer); the adapters map
  them onto the error taxonomy (``chat_errors.upstream_errors``).
* Content coding: none is asked for (no ``Accept-Encoding``); a ``gzip`` or
  ``deflate`` answer is decoded all the same, any other coding is :class:`Malformed`.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import urllib.parse
import zlib
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import httptools

HIGH_WATER = 256 * 1024
"""Bytes of a body waiting for its reader above which the socket stops being read."""

USER_AGENT = "ors"


class UpstreamHttpError(Exception):
    """A request to an upstream that did not get a whole answer."""


class ConnectFailed(UpstreamHttpError):
    """No connection could be opened (refused, unreachable, TLS, or ``connect`` seconds passed)."""


class ReadTimeout(UpstreamHttpError):
    """The upstream stayed silent for ``read`` seconds while an answer was awaited."""


class Disconnected(UpstreamHttpError):
    """The connection ended, or the body broke, before the answer's end."""


class Malformed(UpstreamHttpError):
    """What came back is not an HTTP answer this client reads."""


class Client:
    """Requests to one origin (``scheme://host:port``) over kept-alive connections.

    ``headers`` go with every request (an ``Authorization`` key, say); a value with a
    line break is refused (``ValueError``), so no request can be split. ``tls``: the
    context of an ``https`` origin (the system's trusted certificates by default)."""

    def __init__(self, origin: str, *, connect: float, read: float, keepalive: float,
                 headers: Mapping[str, str] | None = None, tls: ssl.SSLContext | None = None) -> None:
        url = urllib.parse.urlsplit(origin)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) origin: {origin!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = (tls or ssl.create_default_context()) if url.scheme == "https" else None
        self.connect_timeout = connect
        self.read_timeout = read
        self.keepalive = keepalive
        host = f"[{self.host}]" if ":" in self.host else self.host
        default_port = 443 if url.scheme == "https" else 80
        lines = [f"Host: {host}" if self.port == default_port else f"Host: {host}:{self.port}",
                 f"User-Agent: {USER_AGENT}"]
        for name, value in (headers or {}).items():
            if any(c in f"{name}{value}" for c in "\r\n\0") or not name or ":" in name:
                raise ValueError(f"a header that cannot be sent: {name!r}")
            lines.append(f"{name}: {value}")
        self._fixed = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._idle: collections.deque[Connection] = collections.deque()
        self._closed = False

    def request(self, method: str, target: str, body: bytes | None = None,
                headers: bytes = b"") -> _Request:
        """``method`` ``target`` (the path and query) with ``body``, and ``headers``
        (complete lines, each ending in CRLF) beside the fixed ones."""
        head = b"%s %s HTTP/1.1\r\n%s%s" % (method.encode(), target.encode(), self._fixed, headers)
        if body is not None:
            head += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        else:
            head += b"\r\n"
        return _Request(self, head)

    async def aclose(self) -> None:
        """Close the idle connections; a connection in use closes when its request ends."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def idle(self) -> int:
        """Connections in the pool now."""
        return len(self._idle)

    async def _acquire(self) -> Connection:
        idle = self._idle
        while idle:
            connection = idle.pop()
            if connection.reusable(self.keepalive):
                return connection
            connection.close()
        return await self._connect()

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        connection = Connection(loop, self.read_timeout)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await loop.create_connection(lambda: connection, self.host, self.port, ssl=self.tls,
                                             server_hostname=self.host if self.tls is not None else None)
        except TimeoutError as exc:
            raise ConnectFailed(f"no connection to {self.host}:{self.port} within {self.connect_timeout} s") from exc
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return connection

    def _release(self, connection: Connection) -> None:
        if not self._closed and connection.finished():
            idle = self._idle
            idle.append(connection)
            # connections idle for too long go, oldest first
            while not idle[0].reusable(self.keepalive):
                idle.popleft().close()
        else:
            connection.close()


class _Request:
    """``async with client.request(...) as answer``: see :class:`Client`."""

    __slots__ = ("client", "head", "connection")

    def __init__(self, client: Client, head: bytes) -> None:
        self.client = client
        self.head = head
        self.connection: Connection | None = None

    async def __aenter__(self) -> Connection:
        connection = self.connection = await self.client._acquire()
        try:
            connection.send(self.head)
            await connection.answer_head()
        except BaseException:
            self.connection = None
            connection.close()
            raise
        return connection

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            self.client._release(connection)


class Connection(asyncio.Protocol):
    """One connection to the upstream, and the answer it is receiving (see the module
    docstring). The parser runs in :meth:`data_received`; the reader waits on one
    future at a time, woken by the head, a piece of body, the end or a failure."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float) -> None:
        self.loop = loop
        self.read_timeout = read_timeout
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.idle_since = 0.0
        self.busy = False
        self._new_answer()

    def _new_answer(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self._header_lines: list[tuple[bytes, bytes]] = []
        self._head_done = False
        self._until_close = False
        self._keep_alive = False
        self._decoder: Any = None
        self._pieces: list[bytes] = []
        self._waiting = 0
        self._paused = False
        self.complete = False
        self.error: UpstreamHttpError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0

    # -- the request ---------------------------------------------------------------------

    def send(self, head: bytes) -> None:
        assert self.transport is not None
        self.busy = True
        self._last_read = now = self.loop.time()
        self._timer = self.loop.call_at(now + self.read_timeout, self._check_silence)
        self.transport.write(head)

    async def answer_head(self) -> None:
        """Wait for the answer's status line and headers."""
        while not self._head_done and self.error is None:
            await self._wait()
        if self.error is not None:
            raise self.error

    def chunks(self) -> Connection:
        """The body as it arrives: ``async for piece in answer.chunks()``."""
        return self

    def __aiter__(self) -> Connection:
        return self

    async def __anext__(self) -> bytes:
        while True:
            pieces = self._pieces
            if pieces:
                self._pieces = []
                self._waiting = 0
                if self._paused:
                    self._paused = False
                    assert self.transport is not None
                    self.transport.resume_reading()
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)
            if self.complete:
                raise StopAsyncIteration
            if self.error is not None:
                raise self.error
            await self._wait()

    async def read(self, limit: int | None = None) -> bytes:
        """The body, whole, or its first ``limit`` bytes or more (then the connection is
        not reused: the rest is left unread)."""
        body = bytearray()
        async for piece in self:
            body += piece
            if limit is not None and len(body) >= limit:
                break
        return bytes(body)

    def finished(self) -> bool:
        """Whether the answer was read to its end and the connection can serve another."""
        if self._timer is not None:
            self._timer.cancel()
        if not (self.complete and not self._pieces and not self.lost and self.error is None
                and self._keep_alive):
            return False
        self._new_answer()
        self.busy = False
        self.idle_since = self.loop.time()
        return True

    def reusable(self, keepalive: float) -> bool:
        return not self.lost and self.loop.time() - self.idle_since < keepalive

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.busy = False
        if self.transport is not None and not self.lost:
            self.transport.close()

    async def _wait(self) -> None:
        waiter = self._waiter = self.loop.create_future()
        await waiter

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, error: UpstreamHttpError) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self._wake()
        if self.transport is not None and not self.lost:
            self.transport.abort()

    def _check_silence(self) -> None:
        self._timer = None
        if not self.busy or self.complete or self.error is not None:
            return
        now = self.loop.time()
        if self._paused:  # the reader is behind: not the upstream's silence
            self._last_read = now
        elif now - self._last_read >= self.read_timeout:
            self._fail(ReadTimeout(f"no answer for {self.read_timeout} s"))
            return
        self._timer = self.loop.call_at(self._last_read + self.read_timeout, self._check_silence)

    # -- asyncio's side ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # bytes nobody asked for: this connection cannot be trusted
            self.lost = True
            assert self.transport is not None
            self.transport.abort()
            return
        self._last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            kind = Disconnected if self._head_done else Malformed
            self._fail(kind(f"the upstream's answer cannot be read: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close our end too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.busy and not self.complete and self.error is None:
            if self._until_close:  # a body without a length ends with its connection
                self._finish_body()
            else:
                self.error = Disconnected("the upstream closed the connection before the answer's end"
                                          + (f": {exc}" if exc is not None else ""))
        self._wake()

    # -- the parser's callbacks ----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_lines.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer: the real one follows
            self._header_lines = []
            return
        self.status = status
        headers = self.headers = {name.decode("latin-1").lower(): value.decode("latin-1")
                                  for name, value in self._header_lines}
        self._header_lines = []
        self._head_done = True
        self._until_close = ("content-length" not in headers and "chunked" not in headers.get(
            "transfer-encoding", "").lower() and status not in (204, 304))
        coding = headers.get("content-encoding", "identity").strip().lower()
        if coding in ("gzip", "x-gzip", "deflate"):
            self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib, by their header
        elif coding != "identity":
            self._fail(Malformed(f"the upstream answered in a content coding this client does not read: {coding}"))
            return
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._decoder is not None:
            try:
                body = self._decoder.decompress(body)
            except zlib.error as exc:
                self._fail(Disconnected(f"the upstream's compressed body is corrupt: {exc}"))
                return
            if not body:
                return
        self._pieces.append(body)
        self._waiting += len(body)
        if self._waiting > HIGH_WATER and not self._paused:
            self._paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._head_done:
            # asked now: once the message is over the parser is ready for the next one
            self._keep_alive = self.parser.should_keep_alive()
            self._finish_body()

    def _finish_body(self) -> None:
        if self._decoder is not None:
            rest = self._decoder.flush()
            if rest:
                self._pieces.append(rest)
        self.complete = True
        self._wake()
