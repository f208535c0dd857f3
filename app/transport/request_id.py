"""Every request gets an id: the client's ``x-request-id`` when it is a sane token, a new
one otherwise. It is returned as ``x-request-id`` and carried by every log line of the
request (:data:`app.logs.request_id`). A pure ASGI middleware: one header lookup and one
header added, no body buffering, so streams pass through untouched."""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.engine.ids import new_id
from app.logs import request_id

HEADER = b"x-request-id"
_SANE = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        rid = _incoming(scope) or new_id("req")
        token = request_id.set(rid)
        header = (HEADER, rid.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.accept"):
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)


def _incoming(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == HEADER:
            return value.decode() if _SANE.fullmatch(value) else None
    return None
