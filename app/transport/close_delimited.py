"""Bodies of unknown length to HTTP/1.0 clients: delimited by closing the connection.

uvicorn frames every response that has no ``Content-Length`` (a stream: SSE, and
anything else sent in parts) with ``Transfer-Encoding: chunked``, whatever the request's
version. HTTP/1.0 has no chunked coding, and RFC 9112 (section 6.1) forbids sending it
in answer to a 1.0 request: such a client reads the chunk sizes as part of the body
(``b28\\r\\nevent: response.created ...``), so every stream reached it corrupted. The one
framing HTTP/1.0 has for a body of unknown length is the end of the connection.

:func:`delimit_by_close` is installed on the request cycle of each HTTP/1.0 request
(:class:`app.transport.receipt.ReceiptDeadlineProtocol`). A response that starts without
``Content-Length`` or ``Transfer-Encoding`` is then sent as it is, unframed, with
``Connection: close``, and the connection is closed after its last part: that close is
how the client knows the body is complete. A response with a length (every JSON answer,
every error) is not touched, nor is any HTTP/1.1 request.

It works through the state of uvicorn's cycle (``chunked_encoding``,
``expected_content_length``, ``keep_alive``), as :mod:`app.transport.head` works through
its ``transport``: the cycle is told at the start that the body is not chunked and that
the connection will not be kept, and before each part that the length it still expects
is that part's (one byte more while more follows), so that its length checks hold and it
closes the connection after the last part, as it does for any response to a 1.0 request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Send = Callable[[Any], Awaitable[None]]

_NO_BODY_STATUSES = frozenset({204, 304})
_FRAMING = (b"content-length", b"transfer-encoding")


def delimit_by_close(cycle: Any) -> None:
    """Make the cycle (uvicorn's ``RequestResponseCycle`` of an HTTP/1.0 request) send a
    response of unknown length unframed and close the connection after it. Call before
    the application runs (the cycle hands its ``send`` to the application when it starts)."""
    send: Send = cycle.send
    unframed = False

    async def send_delimited_by_close(message: Any) -> None:
        nonlocal unframed
        kind = message["type"]
        if kind == "http.response.start":
            headers = message.get("headers") or ()
            unframed = (
                cycle.scope["method"] != "HEAD"
                and message["status"] not in _NO_BODY_STATUSES
                and not any(name.lower() in _FRAMING for name, _ in headers)
            )
            if unframed:
                cycle.chunked_encoding = False
                cycle.keep_alive = False
        elif unframed and kind == "http.response.body":
            more = bool(message.get("more_body", False))
            cycle.expected_content_length = len(message.get("body", b"")) + (1 if more else 0)
        await send(message)

    cycle.send = send_delimited_by_close
