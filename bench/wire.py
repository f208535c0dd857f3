"""A minimal HTTP/1.1 client on asyncio streams, for load generation.

A general-purpose client (httpx) spends more CPU per request than a fast server does to
answer it, and on a shared machine that cost would weigh on the figures of whatever it
measures. This one does only what a benchmark needs: ``POST`` a prepared request on a
kept-alive connection, read a ``Content-Length`` or chunked answer, and time, from the
moment the request was written, its first byte, its first text (a :class:`Probe`
pattern, looked for in each piece of the body as it arrives) and its end. Measured the
same way directly and through a proxy, its own cost cancels in the difference.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Probe:
    """What marks the first text of an answer, and the end of a stream (a terminal event;
    a JSON answer has none: it is complete when its body is)."""

    text: re.Pattern[bytes]
    terminal: re.Pattern[bytes]


RESPONSES_PROBE = Probe(re.compile(rb"event: response\.output_text\.delta\n"),
                        re.compile(rb"event: response\.(?:completed|failed|incomplete)\n"))
"""``POST /v1/responses``: an ``output_text`` delta; a terminal event."""
CHAT_PROBE = Probe(re.compile(rb'"content":"[^"]'), re.compile(rb"data: \[DONE\]"))
"""``POST /chat/completions``: a chunk (or completion) with content; ``[DONE]``."""
_OVERLAP = 64
"""Bytes of the previous piece searched again with the next (a marker may straddle two)."""


@dataclass(slots=True)
class Exchange:
    """One request's answer. Times are seconds from the moment the request was written;
    ``started`` is that moment (``time.perf_counter``)."""

    started: float
    status: int = 0
    first_byte: float = 0.0
    first_text: float | None = None
    end: float = 0.0
    terminal: bool = False
    error: str | None = None
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return self.error is None and 200 <= self.status < 300

    def json(self) -> Any:
        return json.loads(self.body)


def post(port: int, path: str, body: dict[str, Any]) -> bytes:
    """A complete ``POST`` request with a JSON body, ready to write."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n")
    return head.encode() + payload


class Connection:
    """One kept-alive connection to ``127.0.0.1:port``; requests on it run one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.closed = False

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    def close(self) -> None:
        self.closed = True
        self.writer.close()

    async def exchange(self, request: bytes, probe: Probe, *, keep_body: bool = False,
                       timeout: float = 120) -> Exchange:
        """Write ``request``, read the whole answer. Failures are recorded on the result
        (``error``), never raised; a failed connection is closed."""
        started = time.perf_counter()
        result = Exchange(started)
        try:
            async with asyncio.timeout(timeout):
                self.writer.write(request)
                await self._read(result, probe, keep_body)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError) as exc:
            result.error = type(exc).__name__
            result.end = time.perf_counter() - started
            self.close()
        return result

    async def _read(self, result: Exchange, probe: Probe, keep_body: bool) -> None:
        head = await self.reader.readuntil(b"\r\n\r\n")
        result.first_byte = time.perf_counter() - result.started
        lines = head.decode("latin-1").split("\r\n")
        result.status = int(lines[0].split(" ", 2)[1])
        headers = {name.strip().lower(): value.strip()
                   for name, _, value in (line.partition(":") for line in lines[1:] if line)}
        body: list[bytes] = []
        tail = b""

        def piece(data: bytes) -> None:
            nonlocal tail
            window = tail + data
            now = time.perf_counter() - result.started
            if result.first_text is None and probe.text.search(window):
                result.first_text = now
            if not result.terminal and probe.terminal.search(window):
                result.terminal = True
            tail = window[-_OVERLAP:]
            if keep_body:
                body.append(data)

        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")  # no trailers are sent
                    break
                piece((await self.reader.readexactly(size + 2))[:-2])
        elif "content-length" in headers:
            piece(await self.reader.readexactly(int(headers["content-length"])))
        else:
            while data := await self.reader.read(65536):
                piece(data)
            self.close()
        result.end = time.perf_counter() - result.started
        result.body = b"".join(body)
        if headers.get("connection", "").lower() == "close":
            self.close()
