"""What a check said to the server and what it heard back, for the reports.

Every check's traffic is recorded as it happens, below the checks themselves: HTTP
through an ``httpx`` transport that keeps each request body and tees each response body
(JSON or SSE) as the check reads it, WebSocket through a wrapper around the connection
that keeps every frame sent and received. The checks are unchanged by it; a report
(``--json``, ``--html``) shows a check's exchanges beside its verdict.

Keys never reach a trace: request headers are not recorded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

MAX_RECORDED_BYTES = 2_000_000
"""Bytes of one response body kept for the report; the rest is counted, not kept."""


@dataclass
class Exchange:
    """One HTTP request and its answer, or one WebSocket connection's frames."""

    transport: Literal["http", "websocket"]
    method: str
    url: str
    sent: list[str] = field(default_factory=list)
    """The request body (HTTP), or every frame sent (WebSocket), as text."""
    status: int | None = None
    content_type: str = ""
    received: bytearray = field(default_factory=bytearray)
    """The response body as received (HTTP; bytes beyond the limit are dropped)."""
    frames: list[str] = field(default_factory=list)
    """Every frame received (WebSocket)."""
    dropped: int = 0

    def keep(self, chunk: bytes) -> None:
        room = MAX_RECORDED_BYTES - len(self.received)
        self.received += chunk[: max(room, 0)]
        self.dropped += max(len(chunk) - max(room, 0), 0)

    def messages(self) -> list[Any]:
        """What the server said, one entry per message: each SSE event's data (parsed
        JSON where it is JSON), each WebSocket frame, or the whole body."""
        if self.transport == "websocket":
            return [_parsed(frame) for frame in self.frames]
        text = self.received.decode("utf-8", errors="replace")
        if self.content_type.startswith("text/event-stream"):
            return [_parsed(data) for data in _sse_data(text)]
        return [_parsed(text)] if text else []

    def as_json(self) -> dict[str, Any]:
        return {
            "transport": self.transport,
            "method": self.method,
            "url": self.url,
            "sent": [_parsed(text) for text in self.sent],
            "status": self.status,
            "content_type": self.content_type,
            "received": self.messages(),
            "truncated_bytes": self.dropped,
        }


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _sse_data(text: str) -> Iterator[str]:
    for block in text.replace("\r\n", "\n").split("\n\n"):
        data = [line[5:].lstrip(" ") if line.startswith("data:") else None for line in block.split("\n")]
        kept = [line for line in data if line is not None]
        if kept:
            yield "\n".join(kept)


class Recorder:
    """The exchanges of one session, in order. ``mark``/``since`` slice one check's."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []

    def mark(self) -> int:
        return len(self.exchanges)

    def since(self, mark: int) -> list[Exchange]:
        return self.exchanges[mark:]

    def http_transport(self, inner: httpx.BaseTransport | None = None) -> httpx.BaseTransport:
        return _RecordingTransport(inner or httpx.HTTPTransport(), self)

    def websocket(self, connection: Any, url: str) -> _RecordingConnection:
        exchange = Exchange("websocket", "GET", url, status=101)
        self.exchanges.append(exchange)
        return _RecordingConnection(connection, exchange)


class _RecordingTransport(httpx.BaseTransport):
    def __init__(self, inner: httpx.BaseTransport, recorder: Recorder) -> None:
        self._inner = inner
        self._recorder = recorder

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        exchange = Exchange("http", request.method, str(request.url),
                            sent=[body.decode("utf-8", errors="replace")] if body else [])
        self._recorder.exchanges.append(exchange)
        response = self._inner.handle_request(request)
        exchange.status = response.status_code
        exchange.content_type = response.headers.get("content-type", "")
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Tee(response.stream, exchange),  # type: ignore[arg-type]
            extensions=response.extensions,
            request=request,
        )

    def close(self) -> None:
        self._inner.close()


class _Tee(httpx.SyncByteStream):
    def __init__(self, inner: Any, exchange: Exchange) -> None:
        self._inner = inner
        self._exchange = exchange

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._exchange.keep(chunk)
            yield chunk

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if callable(close):
            close()


class _RecordingConnection:
    """A WebSocket connection whose frames are kept (see ``ws_checks.Connection``)."""

    def __init__(self, inner: Any, exchange: Exchange) -> None:
        self._inner = inner
        self._exchange = exchange

    def send(self, message: str) -> None:
        self._exchange.sent.append(message)
        self._inner.send(message)

    def recv(self, timeout: float | None = None) -> str | bytes:
        frame = self._inner.recv(timeout=timeout)
        self._exchange.frames.append(frame if isinstance(frame, str) else f"<binary frame, {len(frame)} bytes>")
        return frame

    def close(self) -> None:
        self._inner.close()
