"""Request bodies as JSON, the large ones decoded beside the event loop.

``json.loads`` is C code that keeps the GIL for the whole document, so no thread can
take it off the loop: 33 MB of ``{"type": "input_text", "text": "a"}`` parts took 0.3 s
to read here, and the check that then refuses them (``too_many_json_values``) could not
run before. Every other request and stream of the server waited meanwhile.

A body (or WebSocket frame) of more than :data:`OFFLOAD_BYTES` is therefore decoded by
:func:`app.engine.validation.decode_json` in a worker process of its own (one, started
at the first such body; they wait their turn, and how many can wait is bounded by the
bytes of bodies in flight, ``ORS_MAX_BODY_BYTES_IN_FLIGHT``). Its answer is the decoded
value, sent back pickled, or the 400 it raised, rebuilt here whole (message, code and
``param``). What the loop still does for such a body is copy it out and the value back
in: for a 32 MB image sent as a data URL, about a fifth of decoding it (a few large
strings), and for a body of many small values, no more than the value limit allows.
Smaller bodies are decoded in place: below a mebibyte, even the worst shape holds the
loop for milliseconds, less than the trip.

If the worker dies (killed, out of memory), the body is decoded in place, and the next
large body starts another worker. The worker ends with the server (the executor's own
exit handler), or, should the server be killed, when its pipe from the server closes.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from app.engine.limits import RequestLimits
from app.engine.validation import DEFAULT_LIMITS, decode_json
from app.errors import InvalidRequest

log = logging.getLogger("ors.request")

OFFLOAD_BYTES = 1 << 20
"""Bodies larger than this are decoded by the worker process."""

_pool: ProcessPoolExecutor | None = None


async def decode_body(raw: bytes | str, limits: RequestLimits = DEFAULT_LIMITS, *, what: str = "request body") -> Any:
    """:func:`~app.engine.validation.decode_json` of ``raw``, the same value or the same
    400, off the event loop when ``raw`` is large."""
    if len(raw) <= OFFLOAD_BYTES:
        return decode_json(raw, limits, what=what)
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    pool = _pool
    try:
        ok, outcome = await asyncio.get_running_loop().run_in_executor(pool, _decode, raw, limits, what)
    except BrokenProcessPool:
        if _pool is pool:
            _pool = None
        pool.shutdown(wait=False)
        log.warning("the worker that decodes large request bodies stopped; this body is decoded in place")
        return decode_json(raw, limits, what=what)
    if not ok:
        message, code, param = outcome
        raise InvalidRequest(message, code=code, param=param)
    return outcome


def _decode(raw: bytes | str, limits: RequestLimits, what: str) -> tuple[bool, Any]:
    """In the worker: the decoded value, or the 400's message, code and param."""
    try:
        return True, decode_json(raw, limits, what=what)
    except InvalidRequest as error:
        return False, (error.message, error.code, error.param)
