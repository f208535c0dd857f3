"""Liveness (``/healthz``), readiness (``/readyz``), the model list (``/v1/models``), and
an operator's ``POST /v1/models/{id}/load`` and ``/unload`` of an embedded model."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.backends.base import ModelInfo
from app.engine.codex_catalog import check_client_version, codex_catalog
from app.engine.engine import Engine
from app.errors import StoreUnavailable
from app.transport.deps import EngineDep, TenantDep

router = APIRouter()


@router.get("/healthz", include_in_schema=False)
async def healthz(request: Request) -> JSONResponse:
    """200 once the server can serve (models loaded, store open)."""
    if not getattr(request.app.state, "ready", False):
        return JSONResponse({"status": "starting"}, status_code=503)
    return JSONResponse({"status": "ok"})


READY_TIMEOUT_SECONDS = 2.0
"""How long ``/readyz`` waits for the store's answer before it calls it out of reach."""


@router.get("/readyz", include_in_schema=False)
async def readyz(request: Request) -> JSONResponse:
    """Readiness, for a load balancer or an orchestrator's probe: 200 while this server
    can serve now, 503 while it starts, stops, or has an embedded model whose server is
    being started again (another replica serves that model meanwhile). The body names each
    check's state and nothing more (no error text: the probe needs no key).

    The store is checked (one query, :data:`READY_TIMEOUT_SECONDS`) and reported, and an
    unreachable one makes the status ``degraded``, still 200: every replica shares the
    database, so its outage would take them all out of the balancer at once, while
    ``store: false`` requests (Codex sends those) are still served and the others get a
    precise ``503 store_unavailable``. ``/healthz`` stays the liveness probe."""
    state = request.app.state
    engine: Engine = state.engine
    checks: dict[str, Any] = {"server": "stopping" if state.drain.draining
                              else "ok" if getattr(state, "ready", False) else "starting"}
    if checks["server"] == "ok" and engine.store is not None:
        try:
            async with asyncio.timeout(READY_TIMEOUT_SECONDS):
                await engine.store.ping()
            checks["store"] = "ok"
        except (StoreUnavailable, TimeoutError):
            checks["store"] = "unreachable"
    models = {gauges.model: "ok" if gauges.up else "restarting"
              for backend in getattr(state, "backends", ()) for gauges in backend.gauges()}
    if models:
        checks["models"] = models
    if checks["server"] != "ok" or any(value != "ok" for value in models.values()):
        return JSONResponse({"status": "not_ready", **checks}, status_code=503)
    return JSONResponse({"status": "ready" if checks.get("store") == "ok" else "degraded", **checks})


@router.get("/v1/models")
async def list_models(engine: EngineDep, _: TenantDep, client_version: str | None = None) -> dict[str, Any]:
    """The models this server serves, in the OpenAI list shape; with ``client_version``
    (Codex's version, as Codex asks), Codex's catalog of them (:mod:`app.engine.codex_catalog`)."""
    if client_version is not None:
        check_client_version(client_version)
        return codex_catalog(await engine.router.available_models(), engine.router.default_model)
    return {"object": "list", "data": [model_object(info) for info in await engine.router.available_models()]}


@router.post("/v1/models/{model_id}/load")
async def load_model(model_id: str, engine: EngineDep, _: TenantDep) -> dict[str, Any]:
    """Load an embedded model now (as its first request would); the model as listed."""
    name, backend = engine.router.resolve(model_id)
    return model_object(replace(await backend.load(name), id=model_id))


@router.post("/v1/models/{model_id}/unload")
async def unload_model(model_id: str, engine: EngineDep, _: TenantDep) -> dict[str, Any]:
    """Unload an embedded model now (its prompt cache saved); 409 while it serves."""
    name, backend = engine.router.resolve(model_id)
    return model_object(replace(await backend.unload(name), id=model_id))


def model_object(info: ModelInfo) -> dict[str, Any]:
    """A model as ``/v1/models`` lists it: OpenAI's shape, with its window and, for an
    embedded model, its ``status`` (``unloaded``, ``loading``, ``loaded``, ``error``)."""
    return {"id": info.id, "object": "model", "created": 0, "owned_by": info.owned_by,
            "context_window": info.context_window, **({"status": info.status} if info.status else {})}
