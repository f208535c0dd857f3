"""Large bodies are decoded by a worker process: the same value, or the same 400, as
decoding them in place; a worker that dies costs nothing but the trip."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

from app.engine import body_decoding
from app.engine.body_decoding import OFFLOAD_BYTES, decode_body
from app.engine.limits import RequestLimits
from app.engine.validation import decode_json
from app.errors import InvalidRequest

pytestmark = pytest.mark.anyio

LARGE_TEXT = "Grüße, \"quoted\", and commas, " * (OFFLOAD_BYTES // 20)


def _large(value: Any) -> bytes:
    raw = json.dumps(value).encode()
    assert len(raw) > OFFLOAD_BYTES
    return raw


def _outcome(raw: bytes | str, limits: RequestLimits, what: str = "request body") -> Any:
    try:
        return decode_json(raw, limits, what=what)
    except InvalidRequest as error:
        return (type(error), error.message, error.code, error.param)


async def _offloaded(raw: bytes | str, limits: RequestLimits, what: str = "request body") -> Any:
    try:
        return await decode_body(raw, limits, what=what)
    except InvalidRequest as error:
        return (type(error), error.message, error.code, error.param)


BODIES = {
    "a long text": _large({"model": "m", "input": LARGE_TEXT}),
    "many values under the limit": _large({"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a" * 40}] * 20_000}]}),
    "a lone surrogate, escaped": _large({"model": "m", "input": "\ud800" + LARGE_TEXT}),
    "too many values": _large({"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a"}] * 100_000}]}),
    "not JSON": _large({"model": "m", "input": LARGE_TEXT})[:-1],
    "too deep": b"[" * 200 + _large(LARGE_TEXT) + b"]" * 200,
    "NaN": b'{"temperature": NaN, "input": ' + _large(LARGE_TEXT) + b"}",
}


@pytest.mark.parametrize("name", list(BODIES))
async def test_a_large_body_decodes_as_it_would_in_place(name: str) -> None:
    raw = BODIES[name]
    limits = RequestLimits()
    expected = _outcome(raw, limits)
    assert await _offloaded(raw, limits) == expected
    assert await _offloaded(raw.decode("utf-8", "surrogatepass"), limits, "frame") == _outcome(
        raw.decode("utf-8", "surrogatepass"), limits, "frame")


async def test_a_large_body_is_decoded_by_another_process() -> None:
    await decode_body(BODIES["a long text"])
    pool = body_decoding._pool
    assert pool is not None
    workers = list(pool._processes.values())  # noqa: SLF001 - which process decoded it
    assert len(workers) == 1 and workers[0].pid != os.getpid()
    small = json.dumps({"model": "m", "input": "hi"}).encode()
    assert await decode_body(small) == {"model": "m", "input": "hi"}
    assert list(pool._processes.values()) == workers  # noqa: SLF001 - small bodies stay in place


async def test_a_dead_worker_costs_the_trip_and_the_next_body_starts_another() -> None:
    raw = BODIES["a long text"]
    expected = json.loads(raw)
    await decode_body(raw)
    pool = body_decoding._pool
    assert pool is not None
    (worker,) = pool._processes.values()  # noqa: SLF001
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(timeout=30)
    assert await decode_body(raw) == expected  # decoded in place
    assert await decode_body(raw) == expected  # by a new worker
    assert body_decoding._pool is not None and body_decoding._pool is not pool
    (new_worker,) = body_decoding._pool._processes.values()  # noqa: SLF001
    assert new_worker.pid != worker.pid and new_worker.is_alive()
