"""A WebSocket test client for multiplexed connections (``stream_id``) that checks
everything the server says.

Messages are read in arrival order and sorted by their ``stream_id`` (``None`` for
messages without one). Each stream's turns are checked as they arrive: every event goes
through its own stream checker (WebSocket rules, the vendored spec's schemas), every
error envelope must be a valid ``WebSocketErrorEvent`` sent before any event of its turn
(except a refusal, :data:`REFUSALS`, which answers a frame as it arrives), and a turn
ends at its terminal event or its envelope. A ``response.steer.failed``
(which no turn holds) is kept apart, its shape checked here.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from websockets.sync.client import ClientConnection, connect

from compliance import validate_ws_error
from compliance.stream import TERMINAL_EVENT_TYPES, StreamChecker

REFUSALS = {"too_many_queued_frames", "too_many_streams", "server_busy"}
"""Codes of the envelopes that answer a frame at once, whatever turn is running."""


@dataclass
class Turn:
    """One finished turn of a stream: its events (or none, for an envelope), the final
    response or the envelope, and where its first and last messages came in the
    connection's order of arrival."""

    stream: str | None
    events: list[dict[str, Any]]
    final: dict[str, Any]
    first: int
    last: int

    @property
    def failed_early(self) -> bool:
        return not self.events

    @property
    def id(self) -> str:
        return str(self.final["id"])

    def types(self) -> list[str]:
        return [event["type"] for event in self.events]


@dataclass
class _Open:
    checker: StreamChecker
    events: list[dict[str, Any]] = field(default_factory=list)
    first: int = 0


class MuxSocket:
    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self._stack = contextlib.ExitStack()
        self.ws: ClientConnection = self._stack.enter_context(
            connect(url, additional_headers=headers, open_timeout=10))
        self.received: list[dict[str, Any]] = []
        """Every message, in order of arrival."""
        self.finished: list[Turn] = []
        self.steer_failures: list[dict[str, Any]] = []
        self._open: dict[str | None, _Open] = {}

    def send(self, lane: str | None = None, /, **body: Any) -> None:
        """A ``response.create`` (with ``stream_id`` when ``lane`` is given)."""
        frame = {"type": "response.create", **({"stream_id": lane} if lane is not None else {}), **body}
        self.ws.send(json.dumps(frame))

    def send_raw(self, frame: Any) -> None:
        self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    def next(self, timeout: float = 60) -> dict[str, Any]:
        """The next message, checked and recorded."""
        message = json.loads(self.ws.recv(timeout=timeout))
        position = len(self.received)
        self.received.append(message)
        stream = message.get("stream_id")
        if message.get("type") == "response.steer.failed":
            assert set(message) <= {"type", "sequence_number", "steer", "error", "stream_id"}, message
            assert message["error"]["type"] == "invalid_request_error" and message["error"]["message"]
            self.steer_failures.append(message)
            return message
        if message.get("type") == "error" and "sequence_number" not in message:
            validate_ws_error(message)
            if message["error"]["code"] in REFUSALS:  # a frame refused as it came, not a turn's end
                self.finished.append(Turn(stream, [], message, position, position))
                return message
            opened = self._open.pop(stream, None)
            assert opened is None or not opened.events, f"an error envelope after stream {stream!r}'s turn started"
            self.finished.append(Turn(stream, [], message, position, position))
            return message
        opened = self._open.setdefault(stream, _Open(StreamChecker(transport="websocket"), first=position))
        opened.checker.feed(message)
        opened.events.append(message)
        if message["type"] in TERMINAL_EVENT_TYPES:
            del self._open[stream]
            final = opened.checker.finish()
            assert {event["response"]["id"] for event in opened.events if "response" in event} == {final["id"]}
            self.finished.append(Turn(stream, opened.events, final, opened.first, position))
        return message

    def turns(self, count: int, timeout: float = 60) -> list[Turn]:
        """Read until ``count`` more turns have ended; those turns, in the order they ended."""
        start = len(self.finished)
        while len(self.finished) - start < count:
            self.next(timeout)
        return self.finished[start:]

    def until(self, predicate: Any, timeout: float = 60) -> dict[str, Any]:
        """Read until a message satisfies ``predicate``; that message."""
        while True:
            message = self.next(timeout)
            if predicate(message):
                return message

    def close(self) -> None:
        self._stack.close()
