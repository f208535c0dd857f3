"""An ASGI tap: what a real client sent the real server and what it was answered.

Wrapped around the server's app (``app.add_middleware(Tap, log=log)`` before it starts),
it changes nothing and records, per WebSocket connection, every text frame in both
directions in order (:class:`Connection`). Used where the client is a program the test
does not drive (the real Codex CLI) and the test must see the wire.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


@dataclass
class Connection:
    """One WebSocket connection: its path and its text frames, ``("in", frame)`` from the
    client and ``("out", frame)`` from the server, decoded, in the order they passed."""

    path: str
    frames: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def received(self) -> list[dict[str, Any]]:
        return [frame for direction, frame in self.frames if direction == "in"]

    def sent(self) -> list[dict[str, Any]]:
        return [frame for direction, frame in self.frames if direction == "out"]


class Tap:
    def __init__(self, app: ASGIApp, log: list[Connection]) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        connection = Connection(scope["path"])
        self.log.append(connection)

        async def tapped_receive() -> Message:
            message = await receive()
            if message["type"] == "websocket.receive" and message.get("text") is not None:
                connection.frames.append(("in", _decoded(message["text"])))
            return message

        async def tapped_send(message: Message) -> None:
            if message["type"] == "websocket.send" and message.get("text") is not None:
                connection.frames.append(("out", _decoded(message["text"])))
            await send(message)

        await self.app(scope, tapped_receive, tapped_send)


def _decoded(text: str) -> dict[str, Any]:
    """The frame as JSON; one that is not a JSON object is kept as ``{"text": ...}``."""
    try:
        frame = json.loads(text)
    except ValueError:
        return {"text": text}
    return frame if isinstance(frame, dict) else {"text": text}
