"""``POST /v1/responses/input_tokens``: how many input tokens a request would cost, as
``{"object": "response.input_tokens", "input_tokens": N}`` (OpenAI's superset endpoint,
which OpenAI's SDKs call ``client.responses.input_tokens.count``).

The body is a ``POST /v1/responses`` body (``model``, ``input``, ``instructions``,
``previous_response_id``, ``tools``, ``truncation`` …), checked the same way, and the
count is exact: the embedded model's own tokenizer and chat template, the same tokens
the request's ``usage.input_tokens`` would report (:meth:`Engine.count_input_tokens`).
Authenticated, tenant-scoped (a ``previous_response_id`` of another tenant is not found)
and counted by the tenant's rate limits, as the routes that run a model are: counting
loads the model and tokenizes the whole conversation. Nothing is stored.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.engine.body_decoding import decode_body
from app.transport.deps import EngineDep, LimiterDep, TenantDep, history_for

router = APIRouter()


@router.post("/v1/responses/input_tokens")
async def count_input_tokens(request: Request, engine: EngineDep, tenant: TenantDep,
                             limiter: LimiterDep) -> JSONResponse:
    async with await limiter.acquire(tenant):
        data = await decode_body(await request.body(), engine.limits)
        counted = await engine.count_input_tokens(data, tenant=tenant, history=history_for(engine, tenant))
    return JSONResponse({"object": "response.input_tokens", "input_tokens": counted})
