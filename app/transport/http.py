"""HTTP routes: ``POST /v1/responses`` (JSON and SSE), models, health."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from app.engine.turn import Engine, Turn
from app.engine.validation import decode_json, parse_body
from app.protocol.responses import CreateResponseBody, ResponseResource
from app.transport.auth import KeyAuthenticator
from app.transport.errors import error_response
from app.transport.sse import stream_turn

log = logging.getLogger("ors.http")


def get_engine(request: Request) -> Engine:
    return request.app.state.engine  # type: ignore[no-any-return]


def get_tenant(request: Request) -> str:
    authenticator: KeyAuthenticator = request.app.state.authenticator
    return authenticator.tenant(request.headers.get("authorization"))


EngineDep = Annotated[Engine, Depends(get_engine)]
TenantDep = Annotated[str, Depends(get_tenant)]

router = APIRouter()


@router.get("/healthz", include_in_schema=False)
async def healthz(request: Request) -> JSONResponse:
    """200 once the server can serve (models loaded, store open)."""
    if not getattr(request.app.state, "ready", False):
        return JSONResponse({"status": "starting"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/v1/models")
async def list_models(engine: EngineDep, _: TenantDep) -> dict[str, Any]:
    """The models this server serves, in the OpenAI list shape."""
    return {
        "object": "list",
        "data": [
            {"id": info.id, "object": "model", "created": 0, "owned_by": info.owned_by}
            for info in await engine.router.available_models()
        ],
    }


@router.post("/v1/responses")
async def create_response(request: Request, engine: EngineDep, _: TenantDep) -> Response:
    """Create a response: JSON by default, SSE with ``stream: true``."""
    body = parse_body(CreateResponseBody, decode_json(await request.body()))
    turn = engine.prepare(body)
    if body.stream:
        return stream_turn(turn, request.app.state.drain)
    response = await _run_while_connected(request, turn)
    if response.status == "failed" and turn.error is not None:
        return error_response(turn.error)
    return _json(response)


def _json(response: ResponseResource) -> Response:
    return Response(response.model_dump_json(), media_type="application/json")


async def _run_while_connected(request: Request, turn: Turn) -> ResponseResource:
    """Run a non-streaming turn, cancelling it if the client disconnects first."""
    task = asyncio.create_task(turn.run())

    async def watch_disconnect() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                task.cancel()
                return

    watcher = asyncio.create_task(watch_disconnect())
    try:
        return await task
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


def install_routes(app: FastAPI) -> None:
    app.include_router(router)
