"""Compact JSON text, the one way the server writes JSON it builds from plain values
(stored items and documents, upstream request bodies), and reads what an upstream sends
(:func:`loads`).

Written by pydantic-core's serializer (the one every response and event is serialized
with) rather than the standard library's encoder: the same text, compact with non-ASCII
characters kept as they are. Floats keep their value exactly; only very small ones are
spelled differently (``0.00001`` for ``1e-05``).

Text that holds a lone surrogate (which no UTF-8 can carry) is written with every
non-ASCII character escaped, as the standard library writes it with ``ensure_ascii``;
requests have them replaced on the way in, so only values made elsewhere can.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import PydanticSerializationError, from_json, to_json


def dumps(value: Any) -> str:
    """``value`` as compact JSON text, non-ASCII kept (see the module docstring)."""
    try:
        return to_json(value).decode()
    except PydanticSerializationError:
        return json.dumps(value, separators=(",", ":"))


def dumps_bytes(value: Any) -> bytes:
    """:func:`dumps`, as UTF-8 bytes (a request body)."""
    try:
        return to_json(value)
    except PydanticSerializationError:
        return json.dumps(value, separators=(",", ":")).encode()


def loads(raw: str | bytes) -> Any:
    """The value of the JSON text ``raw``, read by pydantic-core's parser (a stream is
    read one chunk per token, so this is on every token's path). Where that parser
    refuses (a lone surrogate escape such as ``"\\ud83d"``, which the standard library
    keeps as it is), and for anything that is not JSON, the standard library's reading
    or error (``ValueError``) is the answer: the same value, or the same refusal, as
    ``json.loads``."""
    try:
        return from_json(raw)
    except ValueError:
        return json.loads(raw)
