"""A deadline for receiving each request: slow or stalled clients hold no connection.

uvicorn bounds the idle time between two requests of a kept-alive connection (5 s), but
nothing else: a connection that never sends a request, one that sends half its headers,
and one that declares a body and stops sending it were all held open for as long as the
client liked (the Slowloris attack, CVE-2007-6750; uvicorn leaves it to a reverse
proxy). A few hundred such connections take every file descriptor the server may open.

:class:`ReceiptDeadlineProtocol` is uvicorn's own httptools protocol with one timer per
connection, armed only while a request is incomplete (``ORS_REQUEST_READ_TIMEOUT``):

* a new connection must begin its first request within the timeout;
* a request's headers must be complete within the timeout of its first byte (not reset
  by more bytes: a client sending one byte a second is held no longer);
* its body may go silent for at most the timeout between two reads (a large upload on
  a slow link keeps going as long as bytes come).

When the timer fires the connection is closed (and logged); a request whose handler is
reading the body sees the client leave, as when a client disconnects. While uvicorn
itself has paused reading (a handler not yet reading its body, pipelined requests), the
timer is put off: that silence is the server's. A request received whole in one read
(nearly all of them) arms no timer at all; the cost per request is three flag updates.
A WebSocket upgrade disarms it: frames are the WebSocket protocol's business.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.transport.close_delimited import delimit_by_close
from app.transport.head import HeadWithBody

log = logging.getLogger("ors.http")


class Receiving(enum.Enum):
    NOTHING = "nothing"
    """Between requests (uvicorn's keep-alive timeout applies)."""
    HEADERS = "headers"
    """A new connection's first request, or a request whose headers are incomplete."""
    BODY = "body"
    """Headers complete, body still coming."""


class ReceiptDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a receipt deadline (see the module docstring),
    whose request cycles send a response's head with the start of its body
    (:mod:`app.transport.head`), and answer an HTTP/1.0 request's stream unframed, ended
    by closing the connection (:mod:`app.transport.close_delimited`). ``read_timeout`` in
    seconds; 0 turns the deadline off."""

    def __init__(self, *args: Any, read_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout = read_timeout
        self.receiving = Receiving.HEADERS
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.get_protocol() is not self:  # upgraded to a WebSocket
            self._disarm()
        elif self.receiving is Receiving.NOTHING:
            if self.deadline is not None:
                self._disarm()
        elif self.receiving is Receiving.BODY or self.deadline is None:
            self._arm()  # a body's silence counts from its last read; headers' from their first

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.receiving = Receiving.HEADERS

    def on_headers_complete(self) -> None:
        previous = self.cycle
        super().on_headers_complete()
        self.receiving = Receiving.BODY
        cycle = self.cycle
        if cycle is not None and cycle is not previous:  # a new request's cycle (not an upgrade)
            cycle.transport = HeadWithBody(cycle, self.transport)
            if cycle.scope["http_version"] == "1.0":
                delimit_by_close(cycle)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.receiving = Receiving.NOTHING

    def _arm(self) -> None:
        if not self.read_timeout:
            return
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = self.loop.call_later(self.read_timeout, self._expired)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expired(self) -> None:
        self.deadline = None
        if self.transport.is_closing() or self.receiving is Receiving.NOTHING:
            return
        if self.flow.read_paused:  # uvicorn stopped reading: the wait is ours, not the client's
            self._arm()
            return
        prefix = f"{self.client[0]}:{self.client[1]} - " if self.client else ""
        log.warning("%sclosed a connection that took more than %gs to send its request's %s",
                    prefix, self.read_timeout, self.receiving.value)
        self.transport.close()
