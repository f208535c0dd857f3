"""``POST /v1/responses/compact``: the compacted window of a conversation, as JSON.

Authenticated and tenant-scoped like every route, and counted by the tenant's rate
limits like ``/v1/responses`` (it may run the model). The body is parsed with the same
parser as ``/v1/responses`` (a missing ``model`` is 400 ``invalid_request`` with
``param: "model"``). Nothing is stored and no response id is created.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.engine.body_decoding import decode_body
from app.engine.compaction import compact_request
from app.engine.files import check_files
from app.engine.images import check_images
from app.engine.limits import check_counts
from app.engine.sealing import Sealer
from app.engine.validation import parse_body
from app.protocol.compaction import CompactBody
from app.transport.deps import EngineDep, LimiterDep, TenantDep, history_for

router = APIRouter()


def _sealer(request: Request) -> Sealer:
    return request.app.state.sealer  # type: ignore[no-any-return]


@router.post("/v1/responses/compact")
async def compact_response(request: Request, engine: EngineDep, tenant: TenantDep, limiter: LimiterDep) -> Response:
    """Summarise the conversation (``previous_response_id`` chain plus ``input``) into a
    window to start a new chain from."""
    async with await limiter.acquire(tenant):
        data = await decode_body(await request.body(), engine.limits)
        if isinstance(data, dict):
            check_counts(data, engine.limits)
        body = parse_body(CompactBody, data)
        await check_images(body.input, max_bytes=engine.max_image_bytes)
        await check_files(body.input, engine.file_limits)
        resource = await compact_request(
            body, router=engine.router, history=history_for(engine, tenant), sealer=_sealer(request)
        )
    return Response(resource.model_dump_json(), media_type="application/json")
