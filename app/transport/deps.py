"""What the HTTP routes share: the app's parts as FastAPI dependencies, a tenant's
history, and a response resource as a JSON answer.

Dependencies are coroutines: FastAPI runs a plain function dependency in a worker
thread, a hop off the event loop for an attribute lookup. Each reads what
:func:`app.main.create_app` put in ``app.state``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.responses import Response

from app.engine.engine import Engine
from app.engine.history import HistorySource, NoHistory, StoredHistory
from app.engine.live import LiveRuns
from app.protocol.items import MAX_ID_LENGTH
from app.protocol.responses import ResponseResource, response_json
from app.transport.auth import KeyAuthenticator
from app.transport.drain import Drain
from app.transport.ratelimit import RateLimiter
from app.transport.sse import StreamOptions


async def get_engine(request: Request) -> Engine:
    return request.app.state.engine  # type: ignore[no-any-return]


async def get_tenant(request: Request) -> str:
    """The tenant of the request's key (401 without a valid one when keys are set). No
    header is read when the server has no keys."""
    authenticator: KeyAuthenticator = request.app.state.authenticator
    return authenticator.tenant(request.headers.get("authorization") if authenticator.keyed else None)


async def get_live(request: Request) -> LiveRuns:
    return request.app.state.live  # type: ignore[no-any-return]


async def get_limiter(request: Request) -> RateLimiter:
    return request.app.state.limiter  # type: ignore[no-any-return]


async def get_drain(request: Request) -> Drain:
    return request.app.state.drain  # type: ignore[no-any-return]


async def get_stream_options(request: Request) -> StreamOptions:
    return request.app.state.stream_options  # type: ignore[no-any-return]


EngineDep = Annotated[Engine, Depends(get_engine)]
TenantDep = Annotated[str, Depends(get_tenant)]
LiveDep = Annotated[LiveRuns, Depends(get_live)]
LimiterDep = Annotated[RateLimiter, Depends(get_limiter)]
DrainDep = Annotated[Drain, Depends(get_drain)]
StreamOptionsDep = Annotated[StreamOptions, Depends(get_stream_options)]
IdPath = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH)]
"""An id in a path (a response's, a conversation's, an item's): checked before any work,
400 naming it when it is longer than any id."""
Cursor = Annotated[str | None, Query(min_length=1, max_length=MAX_ID_LENGTH)]
"""A list's ``after``: absent, or an id (``after=`` is a 400, not "from the start")."""


def history_for(engine: Engine, tenant: str) -> HistorySource:
    """Where a request of ``tenant`` finds the responses it continues."""
    return StoredHistory(engine.store, tenant, engine.history_cache) if engine.store is not None else NoHistory()


def resource_json(response: ResponseResource) -> Response:
    return Response(response_json(response), media_type="application/json")
