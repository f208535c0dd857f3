"""``text.format`` with ``strict: true``: the final text must match the JSON Schema.

The embedded backend constrains generation with a grammar and upstreams get
``response_format``; this check makes the promise hold for every backend. A completed
answer whose text is not valid JSON, or does not match the schema (Draft 2020-12, the
``jsonschema`` library), fails the response with ``model_error`` /
``output_schema_mismatch`` instead of handing the client output that breaks its parser.
An answer cut short by ``max_output_tokens`` is already ``incomplete`` and is left alone.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from app.backends.base import Delta, Finish, GenerationRequest, TextDelta
from app.errors import ModelError


async def enforce_output_format(deltas: AsyncIterator[Delta], request: GenerationRequest) -> AsyncIterator[Delta]:
    fmt = request.output_format
    if fmt.kind != "json_schema" or not fmt.strict or fmt.schema is None:
        async for delta in deltas:
            yield delta
        return
    validator = Draft202012Validator(fmt.schema)
    pieces: list[str] = []
    try:
        async for delta in deltas:
            if isinstance(delta, TextDelta):
                pieces.append(delta.text)
            elif isinstance(delta, Finish) and delta.reason == "stop":
                _check("".join(pieces), validator)
            yield delta
    finally:
        await deltas.aclose()  # type: ignore[attr-defined]


def _check(text: str, validator: Draft202012Validator) -> None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(
            f"The model's answer is not valid JSON ({exc.msg}), although text.format is strict.",
            code="output_schema_mismatch",
        ) from None
    error = best_match(validator.iter_errors(value))
    if error is not None:
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise ModelError(
            f"The model's answer does not match the strict text.format schema at {where}: {error.message}",
            code="output_schema_mismatch",
        )
