"""``GET /metrics`` and the middleware that counts requests (see :mod:`app.metrics`).

The middleware is pure ASGI: it notes the status when the response starts and counts the
request when it ends (a stream is counted once it is over), labelled by the route's
template (``/v1/responses/{response_id}``, never the id itself; ``unmatched`` for paths
no route serves), so the number of series stays bounded. It writes the request's access
line then too (:func:`app.logs.log_access`), after the response's last byte left.

``/metrics`` is protected like the API: with ``ORS_METRICS_KEY`` set, only that bearer
key reads it; otherwise, with ``ORS_API_KEYS`` set, any API key does; with neither, it
is open (like the API itself).
"""

from __future__ import annotations

import hmac
import time

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import Unauthorized
from app.logs import log_access
from app.metrics import Metrics, RequestLabels, current_request


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        labels = RequestLabels()
        token = current_request.set(labels)
        status = 500
        started = time.perf_counter()

        async def noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noting_status)
        finally:
            current_request.reset(token)
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.http_request(template, scope["method"], status, labels.model)
            log_access(scope, status, time.perf_counter() - started)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        gauge = self.metrics.websocket_connections
        accepted = False

        async def noting_accept(message: Message) -> None:
            nonlocal accepted
            if message["type"] == "websocket.accept" and not accepted:
                accepted = True
                gauge.inc()
            await send(message)

        try:
            await self.app(scope, receive, noting_accept)
        finally:
            if accepted:
                gauge.dec()


def install_metrics(app: FastAPI, metrics: Metrics, *, metrics_key: str | None) -> None:
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    key = metrics_key.encode() if metrics_key else None

    @app.get("/metrics", include_in_schema=False)
    async def read_metrics(request: Request) -> Response:
        authorization = request.headers.get("authorization")
        if key is not None:
            scheme, _, token = (authorization or "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
                raise Unauthorized("Send the metrics key: 'Authorization: Bearer <ORS_METRICS_KEY>'.")
        else:
            request.app.state.authenticator.tenant(authorization)  # 401 unless a valid API key (when keys are set)
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
