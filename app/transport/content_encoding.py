"""Compressed request bodies: ``Content-Encoding: zstd``, ``gzip`` (``x-gzip``) and
``deflate``, decoded as the app reads the body.

:class:`app.transport.guards.Guards` accepts these codings (:func:`coding_of`; any other
is 415 ``unsupported_media_type``) and hands such a request's ``receive`` to
:class:`DecodedBody`. Its contract:

* **The body-size limit is the decoded size's.** The compressed body is read whole
  (refused 413 ``request_too_large`` past ``ORS_MAX_BODY_BYTES``, as a plain one), then
  decompressed :data:`STEP_BYTES` at a time, and refused 413 as soon as its decoded size
  passes the same limit: a small body that would inflate to gigabytes (a "zip bomb")
  never holds more than the limit (and one step) in memory. zstd frames that ask for a
  window over :data:`MAX_ZSTD_WINDOW` are refused too (their decoder would allocate it).
* **Bounded steps.** The app reads the decoded body as a series of messages of at most
  :data:`STEP_BYTES`; between two the event loop runs other tasks, so decompressing a
  large body never holds it for more than one step.
* **Bodies in flight** (``ORS_MAX_BODY_BYTES_IN_FLIGHT``) count the compressed bytes
  while they are held and the decoded bytes from their decoding until the response is
  over; one past the bound is 429 ``server_busy``, as a plain body.
* **A corrupt body** is 400 ``invalid_body`` (``param`` null), naming the coding, and so
  is a gzip or deflate body cut short. A zstd body cut short decodes to what it holds
  (``zstandard``'s bounded reader does not tell a frame cut short from a whole one), so
  its JSON is cut short too: 400 ``invalid_json``.

Decoding starts when the app first reads the body (after authentication and the rate
limit), and its refusals are raised from that read, so they leave as the spec's error
object through the app's exception handlers like any other. WebSocket frames are never
compressed this way.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import zlib
from collections.abc import Callable
from typing import Any, Protocol

import zstandard

from app.errors import InvalidRequest, ORSError, PayloadTooLarge, UnsupportedMediaType
from app.transport.errors import error_response

STEP_BYTES = 256 * 1024
"""The decoded bytes one step of decompression produces at most."""

MAX_ZSTD_WINDOW = 8 * 1024 * 1024
"""The largest zstd window accepted: the 8 MiB the zstd format recommends every decoder
support (a window is memory the decoder allocates, whatever the body's size)."""

CODINGS = ("zstd", "gzip", "deflate")
"""The content codings a request body may be sent with, besides ``identity``."""

_ALIASES = {b"zstd": "zstd", b"gzip": "gzip", b"x-gzip": "gzip", b"deflate": "deflate"}


def coding_of(encoding: bytes | None) -> str | None:
    """The coding a ``Content-Encoding`` header names (``None`` for none or ``identity``);
    raises ``UnsupportedMediaType`` for any other value, or for more than one coding."""
    if encoding is None:
        return None
    name = encoding.strip().lower()
    if name in (b"", b"identity"):
        return None
    coding = _ALIASES.get(name)
    if coding is None:
        raise UnsupportedMediaType(
            f"Request bodies may be sent uncompressed or with 'Content-Encoding' {', '.join(CODINGS)} "
            f"(got 'Content-Encoding: {encoding.decode('latin-1')}')."
        )
    return coding


class _Reader(Protocol):
    def read(self, size: int) -> bytes: ...


class _DeflateReader:
    """A zlib stream (RFC 1950, HTTP's ``deflate``) read ``size`` decoded bytes at a time."""

    def __init__(self, data: bytes) -> None:
        self._inflater = zlib.decompressobj()
        self._pending = data

    def read(self, size: int) -> bytes:
        inflater = self._inflater
        while not inflater.eof:
            out = inflater.decompress(self._pending, size)
            self._pending = inflater.unconsumed_tail
            if out:
                return out
            if not self._pending:
                raise EOFError("the compressed data ends before its end marker")
        if inflater.unused_data:
            raise zlib.error("data follows the end of the compressed stream")
        return b""


def _reader(coding: str, data: bytes) -> _Reader:
    if coding == "gzip":
        return gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb")
    if coding == "deflate":
        return _DeflateReader(data)
    decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW)
    return decompressor.stream_reader(data, read_across_frames=True)


_CORRUPT = (OSError, EOFError, zlib.error, zstandard.ZstdError)
"""What the decoders raise for data that is not of their coding (``gzip.BadGzipFile`` is
an ``OSError``)."""


class Budget(Protocol):
    """The part of :class:`app.transport.guards.BodyBudget` used here."""

    def take(self, size: int) -> bool: ...

    def give_back(self, size: int) -> None: ...

    def full(self) -> ORSError: ...


class DecodedBody:
    """One request's ``receive``, its compressed body decoded (see the module docstring).
    :meth:`receive` is what the app is given; :meth:`release` gives back the bytes it
    counted, once the response is over."""

    def __init__(self, receive: Callable[[], Any], coding: str, *, limit: int, bodies: Budget,
                 too_large: Callable[[], PayloadTooLarge]) -> None:
        self._receive = receive
        self.coding = coding
        self.limit = limit
        self.bodies = bodies
        self.too_large = too_large
        self.held = 0
        self.decoded = 0
        self._reader: _Reader | None = None
        self._compressed = 0
        self._done = False

    async def receive(self) -> Any:
        if self._done:
            return await self._receive()  # the body is over: a disconnect, or nothing more
        if self._reader is None:
            data = await self._read_compressed()
            if data is None:
                self._done = True
                return {"type": "http.disconnect"}
            self._reader = _reader(self.coding, data)
        else:
            await asyncio.sleep(0)  # one step at a time: let the loop run between two
        try:
            piece = self._reader.read(STEP_BYTES)
        except _CORRUPT as error:
            raise InvalidRequest(
                f"The request body is not valid {self.coding} data ({error or type(error).__name__}): "
                "it could not be decompressed.",
                code="invalid_body",
            ) from None
        if not piece:
            self._done = True
            self._reader = None
            self._give(self._compressed)  # the compressed bytes are no longer held
            return {"type": "http.request", "body": b"", "more_body": False}
        self.decoded += len(piece)
        if self.decoded > self.limit:
            raise self.too_large()
        self._take(len(piece))
        return {"type": "http.request", "body": piece, "more_body": True}

    async def _read_compressed(self) -> bytes | None:
        """The whole compressed body, or ``None`` if the client left while sending it."""
        chunks: list[bytes] = []
        while True:
            message = await self._receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            if self._compressed + len(chunk) > self.limit:
                raise self.too_large()
            self._take(len(chunk))
            self._compressed += len(chunk)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _take(self, size: int) -> None:
        if not self.bodies.take(size):
            raise self.bodies.full()
        self.held += size

    def _give(self, size: int) -> None:
        self.bodies.give_back(size)
        self.held -= size

    def release(self) -> None:
        self.bodies.give_back(self.held)
        self.held = 0


async def serve_decoded(app: Callable[..., Any], scope: Any, body: DecodedBody, send: Callable[..., Any]) -> None:
    """Run ``app`` on a request whose body ``body`` decodes; a refusal raised while the
    body was read that escaped the app (nothing sent yet) is answered here."""
    started = False

    async def watching_send(message: Any) -> None:
        nonlocal started
        started = started or message["type"] == "http.response.start"
        await send(message)

    try:
        await app(scope, body.receive, watching_send)
    except ORSError as error:
        if started:
            raise
        await error_response(error)(scope, body.receive, send)
    finally:
        body.release()
