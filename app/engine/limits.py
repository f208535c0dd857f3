"""The limits a request's JSON must keep before any work is done on it.

Every limit comes from the one settings object (``ORS_MAX_*``) and is checked on the
decoded JSON, before validation, the replay gate or the store see it, so an oversized
request costs a length check and nothing more. Each exceeded limit is a 400 that names
the limit, its value and the ``param``. (Body bytes are checked by the transport before
the body is read; schema bytes and depth by :mod:`app.schemas`.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from app.errors import InvalidRequest
from app.schemas import SchemaLimits

DEFAULT_MAX_JSON_DEPTH = 128
DEFAULT_MAX_INPUT_ITEMS = 10_000
DEFAULT_MAX_TOOLS = 256


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    """How deep objects and arrays may nest in a request body."""
    max_input_items: int = DEFAULT_MAX_INPUT_ITEMS
    """Items in ``input`` (a string input is one message)."""
    max_tools: int = DEFAULT_MAX_TOOLS
    """Entries in ``tools``."""
    schema: SchemaLimits = field(default_factory=SchemaLimits)
    """Bytes and depth of each JSON Schema (tool ``parameters``, ``text.format.schema``)."""


def check_counts(data: dict[str, Any], limits: RequestLimits) -> None:
    """400 when ``input`` or ``tools`` holds more entries than the limits allow."""
    items = data.get("input")
    if isinstance(items, list) and len(items) > limits.max_input_items:
        raise InvalidRequest(
            f"input has {len(items):,} items, more than this server's limit of "
            f"{limits.max_input_items:,} (ORS_MAX_INPUT_ITEMS). Use previous_response_id or "
            "compaction to carry long conversations.",
            code="too_many_input_items",
            param="input",
        )
    tools = data.get("tools")
    if isinstance(tools, list) and len(tools) > limits.max_tools:
        raise InvalidRequest(
            f"tools has {len(tools):,} entries, more than this server's limit of "
            f"{limits.max_tools:,} (ORS_MAX_TOOLS).",
            code="too_many_tools",
            param="tools",
        )


def json_depth_exceeded(value: Any, max_depth: int) -> bool:
    """Whether objects and arrays in ``value`` nest deeper than ``max_depth``; iterative,
    and it stops at the first container too deep. Scalars and strings cost nothing."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            return True
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def too_deep(max_depth: int, raw: bytes) -> InvalidRequest:
    """The 400 for a body nested deeper than ``max_depth``; its ``param`` is the top-level
    field where the nesting goes too deep (found by a scan of the raw bytes, on this
    error path only)."""
    depth = 0
    key: str | None = None
    for token in _TOKENS.finditer(raw):
        text = token.group()
        if text in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                break
        elif text in (b"]", b"}"):
            depth -= 1
        elif depth == 1 and raw[token.end():token.end() + 64].lstrip().startswith(b":"):
            key = text[1:-1].decode(errors="replace")
    return InvalidRequest(
        f"The request body nests objects and arrays more than {max_depth} deep, this server's "
        "limit (ORS_MAX_JSON_DEPTH).",
        code="json_too_deep",
        param=key,
    )
