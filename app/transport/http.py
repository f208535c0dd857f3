"""The HTTP and WebSocket API, mounted on the app: one FastAPI router per concept.

* :mod:`app.transport.create`: ``POST /v1/responses`` (JSON, SSE, background);
* :mod:`app.transport.lifecycle`: retrieve, delete and cancel a response, its input items;
* :mod:`app.transport.compact`, :mod:`app.transport.input_tokens`: the superset endpoints
  under ``/v1/responses/``;
* :mod:`app.transport.websocket`: the WebSocket transport on ``/v1/responses``;
* :mod:`app.transport.health`: ``/healthz``, ``/readyz``, ``GET /v1/models``;
* :mod:`app.transport.conversations`: OpenAI's Conversations API, ``/v1/conversations``;
* :mod:`app.transport.ui` and :mod:`app.transport.checks`: the playground page at ``/``
  and its conformance runs under ``/ors/checks`` (unless ``ORS_UI=false``).

Every route goes through FastAPI's router and its dependencies
(:mod:`app.transport.deps`); every error leaves through the one mapping of
:mod:`app.transport.errors`.
"""

from __future__ import annotations

from fastapi import FastAPI

from app.transport import checks, compact, conversations, create, health, input_tokens, lifecycle, ui, websocket
from app.transport.sse import StreamOptions, leave_shutdown_to_the_drain


def install_routes(app: FastAPI) -> None:
    """Mount the routes; streams are sent as ``app.state.settings`` says, and ended at
    shutdown by ``app.state.drain`` (:mod:`app.transport.sse`)."""
    app.state.stream_options = StreamOptions.from_settings(app.state.settings)
    leave_shutdown_to_the_drain()
    for module in (create, lifecycle, compact, input_tokens, websocket, health, conversations):
        app.include_router(module.router)
    if app.state.settings.ui:
        ui.install(app)
        app.include_router(checks.router)
