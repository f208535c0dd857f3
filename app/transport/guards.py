"""Exposure guards: what every HTTP request and WebSocket upgrade must pass before the
app sees it, as one pure-ASGI middleware, plus the start-up check on the bind address.

In order, each refusal an :mod:`app.errors` error rendered by
:func:`app.transport.errors.error_response` (the spec's error object):

1. **Host** (only when the server is bound to a loopback address): the ``Host`` header
   must name ``localhost``, ``127.0.0.1`` or ``[::1]`` (any port), or a name in
   ``ORS_ALLOWED_HOSTS``; otherwise 403 ``host_not_allowed``. A web page whose domain
   was re-pointed at 127.0.0.1 (DNS rebinding) sends its own domain as the Host, so it
   cannot reach a server on the user's machine. 403 rather than 421: the request is
   refused by policy, and 421 invites clients to retry on another connection. A request
   without a Host header (HTTP/1.0) cannot come from a browser and passes.
2. **Origin** of a WebSocket upgrade: an upgrade that carries an ``Origin`` header (a
   browser) must name an origin of ``ORS_ALLOWED_ORIGINS`` or this server's own (the
   ``Host`` it was sent to, which the first guard checked: the playground's page);
   otherwise it is refused before the handshake completes, 403 ``origin_not_allowed``.
   An upgrade without one (SDKs, command-line clients) passes: only browsers send it,
   and only browsers can be made to connect by a page of another site.
3. **Content-Type** of a ``POST``: ``application/json``, optionally with ``charset=utf-8``;
   otherwise 415 ``unsupported_media_type`` (``param`` null). Browsers send a JSON type
   cross-site only after a CORS preflight, so a form or ``text/plain`` post from another
   site never runs a generation. A ``POST`` without a body and without a Content-Type
   (``curl -X POST …/cancel``) passes: there is nothing to parse, and the one such
   endpoint acts on a response id that another site cannot know. A body sent with a
   ``Content-Encoding`` other than ``identity``, ``zstd``, ``gzip`` or ``deflate``
   (:func:`app.transport.content_encoding.coding_of`) is refused the same way, saying
   so; a compressed one is decoded as the app reads it, by
   :class:`app.transport.content_encoding.DecodedBody`, whose contract holds what
   follows (size, bodies in flight) for the decoded bytes.
4. **Body size**: a ``Content-Length`` above ``ORS_MAX_BODY_BYTES`` is refused before a
   byte is read; a chunked body is counted as the app reads it and refused (the read
   raises) as soon as it passes the limit, so no more than the limit is ever handed on.
   413 ``request_too_large``. WebSocket messages are bounded by the server itself
   (uvicorn's ``ws_max_size``, set to the same limit by :mod:`app.serve`).
5. **Bodies in flight** (:class:`BodyBudget`): the bytes of all HTTP request bodies
   the server holds at once are bounded by ``ORS_MAX_BODY_BYTES_IN_FLIGHT``. A body is
   counted from its headers (its Content-Length, before a byte of it is read; a
   chunked body as it arrives) until its response is over, as a request's body and what
   is parsed from it live as long as its response. One that would pass the bound is
   429 ``server_busy`` with ``Retry-After: 1``, which SDKs retry; a WebSocket
   ``response.create`` frame counts the same way while it waits and while its turn runs
   (:mod:`app.transport.websocket`), and one past the bound is answered with that error
   and dropped. Without it, a few dozen clients each sending a body at the size limit
   could make the kernel end the process, and every stream it serves.

6. **Body receipt** (``ORS_REQUEST_READ_TIMEOUT``): while a request's body is still
   coming, each read of it waits at most this long; a client silent for longer is
   answered 408 ``request_timeout`` and its connection closed, so a client that declares
   a body and stops sending it holds no request. A slow body that keeps coming is read
   as long as it comes. (The time a client takes to send its headers is not seen by the
   app: the reverse proxy bounds it, README "Behind a reverse proxy".)

Cost on the hot path: one pass over the header list and a few byte comparisons; the
receive channel is wrapped only for a request with a body.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Iterable
from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from app.errors import Forbidden, ORSError, PayloadTooLarge, RequestTimeout, TooManyRequests, UnsupportedMediaType
from app.transport.content_encoding import DecodedBody, coding_of, serve_decoded
from app.transport.errors import error_response

log = logging.getLogger("ors.http")

LOOPBACK_NAMES = frozenset({b"localhost", b"127.0.0.1", b"[::1]"})
_JSON = b"application/json"
_UTF8 = frozenset({b"utf-8", b"utf8"})


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on a loopback interface only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(host: str, *, has_keys: bool, allow_unauthenticated: bool) -> str | None:
    """Why the server must not start on ``host``, or ``None``: a non-loopback address
    without API keys serves anyone who can reach it, unless that is explicitly allowed."""
    if has_keys or allow_unauthenticated or is_loopback(host):
        return None
    return (
        f"Refusing to listen on {host} without API keys: anyone who can reach this address could use "
        "the server. Set ORS_API_KEYS to one or more comma-separated keys (clients then send "
        "'Authorization: Bearer <key>'), or listen on a loopback address (ORS_HOST=127.0.0.1), or set "
        "ORS_ALLOW_UNAUTHENTICATED=true to serve without keys anyway."
    )


def _origin(value: str) -> bytes:
    return value.strip().rstrip("/").lower().encode("latin-1")


class Guards:
    """The middleware. ``bind_host`` is the address the server listens on (the Host
    check applies only to loopback binds); ``allowed_origins`` may hold ``*``;
    ``read_timeout`` in seconds, 0 for none."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        bind_host: str,
        allowed_hosts: Iterable[str],
        allowed_origins: Iterable[str],
        max_body_bytes: int,
        bodies: BodyBudget | None = None,
        read_timeout: float = 0,
    ) -> None:
        self.app = app
        self.read_timeout = read_timeout
        self.bodies = bodies if bodies is not None else BodyBudget(0)
        self.check_host = is_loopback(bind_host)
        self.hosts = LOOPBACK_NAMES | {name.strip().lower().encode("idna") for name in allowed_hosts if name.strip()}
        origins = {_origin(origin) for origin in allowed_origins if origin.strip()}
        self.any_origin = b"*" in origins
        self.origins = frozenset(origins)
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = content_type = length = encoding = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
            elif name == b"content-type":
                content_type = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"content-encoding":
                encoding = value
        error = self._host_error(host)
        coding = None
        if error is None and scope["method"] == "POST" and (
            content_type is not None or chunked or (length is not None and length != b"0")
        ):
            error = _content_type_error(content_type)
            if error is None and encoding is not None:
                try:
                    coding = coding_of(encoding)
                except UnsupportedMediaType as refused:
                    error = refused
        size = _declared(length) if length is not None else 0
        if error is None and size > self.max_body_bytes:
            error = self._too_large()
        if error is not None:
            await error_response(error)(scope, receive, send)
            return
        if coding is not None:
            body = DecodedBody(self._in_time(scope, receive), coding, limit=self.max_body_bytes,
                               bodies=self.bodies, too_large=self._too_large)
            await serve_decoded(self.app, scope, body, send)
            return
        if not chunked or length is not None:
            # a Content-Length body cannot grow past its declared length (the server
            # enforces it), so only a chunked body needs counting
            if not size:
                await self.app(scope, receive, send)
                return
            if not self.bodies.take(size):
                await error_response(self.bodies.full())(scope, receive, send)
                return
            try:
                await self.app(scope, self._in_time(scope, receive), send)
            finally:
                self.bodies.give_back(size)
            return
        await self._counted(scope, self._in_time(scope, receive), send)

    def _in_time(self, scope: Scope, receive: Receive) -> Receive:
        """``receive``, each read of the body bounded by :attr:`read_timeout` until the
        body is complete (then as it is: waiting for the client to leave is not reading)."""
        timeout = self.read_timeout
        if not timeout:
            return receive
        complete = False

        async def receive_in_time() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout(timeout):
                    message = await receive()
            except TimeoutError:
                client = scope.get("client")
                log.warning("%sa request's body went silent for more than %gs: answered 408",
                            f"{client[0]}:{client[1]} - " if client else "", timeout)
                raise RequestTimeout(
                    f"The request's body stopped coming for more than {timeout:g} seconds (ORS_REQUEST_READ_TIMEOUT)."
                ) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        return receive_in_time

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.max_body_bytes
        bodies = self.bodies
        received = 0
        started = False

        async def counting_receive() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                if received + size > limit:
                    raise self._too_large()
                if not bodies.take(size):
                    raise bodies.full()
                received += size
            return message

        async def watching_send(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, watching_send)
        except (PayloadTooLarge, TooManyRequests) as error:
            if started:
                raise
            await error_response(error)(scope, receive, send)
        finally:
            bodies.give_back(received)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = origin = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
        error = self._host_error(host)
        if error is None and origin is not None and not self._origin_allowed(origin, host):
            error = Forbidden(
                f"WebSocket connections from origin {origin.decode('latin-1')!r} are not allowed "
                "(ORS_ALLOWED_ORIGINS lists the allowed ones).",
                code="origin_not_allowed",
            )
        if error is None:
            await self.app(scope, receive, send)
            return
        await _deny(WebSocket(scope, receive, send), error)

    def _host_error(self, host: bytes | None) -> ORSError | None:
        if not self.check_host or host is None:
            return None
        if host.startswith(b"["):
            name = host[: host.find(b"]") + 1]
        else:
            name = host.partition(b":")[0]
        if name.lower() in self.hosts:
            return None
        return Forbidden(
            f"Host {host.decode('latin-1')!r} is not served here: this server listens on a loopback address "
            "and answers to localhost, 127.0.0.1 and [::1] (ORS_ALLOWED_HOSTS adds names).",
            code="host_not_allowed",
        )

    def _origin_allowed(self, origin: bytes, host: bytes | None) -> bool:
        origin = origin.rstrip(b"/").lower()
        own = host is not None and origin.partition(b"://")[2] == host.lower()
        return own or self.any_origin or origin in self.origins

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"The request body is larger than {self.max_body_bytes} bytes (ORS_MAX_BODY_BYTES).")


class BodyBudget:
    """The bytes of request bodies held at once, bounded by ``limit`` (0: no bound); see
    the module docstring. Used by the event loop's thread only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        """Count ``size`` more bytes as held, if the bound allows it."""
        if self.limit and self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give_back(self, size: int) -> None:
        self.held -= size

    def full(self) -> TooManyRequests:
        return TooManyRequests(
            f"The server already holds {self.held:,} bytes of request bodies, and this one would pass its bound of "
            f"{self.limit:,} (ORS_MAX_BODY_BYTES_IN_FLIGHT). Retry shortly.",
            code="server_busy",
        )


def _declared(length: bytes) -> int:
    """The Content-Length (the server has already refused a malformed one)."""
    try:
        return int(length)
    except ValueError:
        return 0


def _content_type_error(content_type: bytes | None) -> ORSError | None:
    if content_type is not None:
        media, _, parameters = content_type.partition(b";")
        if media.strip().lower() == _JSON and _utf8_or_unset(parameters):
            return None
    shown = content_type.decode("latin-1") if content_type is not None else "none"
    return UnsupportedMediaType(
        f"Request bodies must be sent as 'Content-Type: application/json' (got {shown})."
    )


def _utf8_or_unset(parameters: bytes) -> bool:
    for parameter in parameters.split(b";") if parameters else ():
        name, _, value = parameter.partition(b"=")
        if name.strip().lower() == b"charset" and value.strip().strip(b'"').lower() not in _UTF8:
            return False
    return True


class Cors(CORSMiddleware):
    """Starlette's CORS, except that a refused preflight is the spec's error object
    (403 ``cors_not_allowed``) rather than plain text."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        detail = bytes(response.body).decode("utf-8", "replace")
        return error_response(Forbidden(f"CORS preflight refused: {detail}.", code="cors_not_allowed"))


async def _deny(socket: WebSocket, error: ORSError) -> None:
    """Refuse an upgrade before it is accepted: the error object as an HTTP response when
    the server can send one, else a close before the handshake (which is a 403)."""
    if "websocket.http.response" in socket.scope.get("extensions", {}):
        await socket.send_denial_response(error_response(error))
    else:
        await socket.close(code=1008)
