"""``text.format`` with ``strict: true``: the final text must match the JSON Schema.

The embedded backend constrains generation with a grammar and upstreams get
``response_format``; this check makes the promise hold for every backend. A completed
answer whose text is not valid JSON, or does not match the schema (as compiled by
:mod:`app.schemas` when the request was admitted; checked in a worker thread), fails the response with ``model_error`` /
``output_schema_mismatch`` instead of handing the client output that breaks its parser.
An answer cut short by ``max_output_tokens`` is already ``incomplete`` and is left alone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from app.backends.base import Delta, Finish, GenerationRequest, TextDelta
from app.errors import ModelError
from app.schemas import Compiled, admitted, json_path


def enforce_output_format(deltas: AsyncIterator[Delta], request: GenerationRequest) -> AsyncIterator[Delta]:
    """``deltas``, checked against a strict ``text.format`` at their end; ``deltas``
    themselves when there is none to hold (no generator layer that only passes deltas
    on: each delta of each response would cross it)."""
    if not checks_output_format(request):
        return deltas
    return _enforced(deltas, admitted(request.output_format.schema))


def checks_output_format(request: GenerationRequest) -> bool:
    """Whether ``request`` has a strict ``text.format`` whose schema its answer is held to."""
    fmt = request.output_format
    return fmt.kind == "json_schema" and bool(fmt.strict) and fmt.schema is not None


async def _enforced(deltas: AsyncIterator[Delta], compiled: Compiled) -> AsyncIterator[Delta]:
    pieces: list[str] = []
    try:
        async for delta in deltas:
            if isinstance(delta, TextDelta):
                pieces.append(delta.text)
            elif isinstance(delta, Finish) and delta.reason == "stop":
                await asyncio.to_thread(_check, "".join(pieces), compiled)
            yield delta
    finally:
        await deltas.aclose()  # type: ignore[attr-defined]


def _check(text: str, compiled: Compiled) -> None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(
            f"The model's answer is not valid JSON ({exc.msg}), although text.format is strict.",
            code="output_schema_mismatch",
        ) from None
    if compiled.validator is None:  # admitted when the request was made; never expected
        raise ModelError(f"The strict text.format schema cannot be checked: {compiled.problem}",
                         code="output_schema_mismatch")
    try:
        error = compiled.first_error(value)
    except RecursionError:
        raise ModelError("The model's answer nests too deeply to check against the strict text.format schema.",
                         code="output_schema_mismatch") from None
    if error is not None:
        where = json_path(error)
        raise ModelError(
            f"The model's answer does not match the strict text.format schema at {where}: {error.message}",
            code="output_schema_mismatch",
        )
