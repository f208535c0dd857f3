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
DEFAULT_MAX_JSON_VALUES = 200_000
DEFAULT_MAX_INPUT_ITEMS = 10_000
DEFAULT_MAX_TOOLS = 256


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    """How deep objects and arrays may nest in a request body."""
    max_json_values: int = DEFAULT_MAX_JSON_VALUES
    """Values a request body may hold: members of objects and elements of arrays, at any depth."""
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


def check_json_shape(value: Any, raw: bytes | str, max_depth: int, max_values: int) -> None:
    """400 when objects and arrays in ``value`` (decoded from ``raw``) nest deeper than
    ``max_depth`` (``json_too_deep``) or hold more than ``max_values`` values in all
    (``too_many_json_values``): members of objects and elements of arrays, at any depth.

    Every value costs the event loop time on its way in (validated, converted to its
    stored form, recorded), and nothing else bounds how many a body may spell, so one
    request of tiny parts could hold every other. One iterative walk checks both, at
    the cost of a ``len`` per container; it stops at the first container too deep, or
    once the count is over. Scalars and strings cost nothing."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    values = 0
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            raise too_deep(max_depth, raw if isinstance(raw, bytes) else raw.encode(errors="replace"))
        values += len(children)
        if values > max_values:
            raise _too_many_values(value, max_values)
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))


def _too_many_values(value: Any, max_values: int) -> InvalidRequest:
    """The 400 for a body of more than ``max_values`` values; its ``param`` is the
    top-level field that holds the most (counted on this error path only)."""
    param = None
    if isinstance(value, dict):
        param = max(value, key=lambda key: _values_in(value[key]), default=None)
    return InvalidRequest(
        f"The request body holds more than {max_values:,} values (members of objects and elements "
        "of arrays), this server's limit (ORS_MAX_JSON_VALUES).",
        code="too_many_json_values",
        param=param,
    )


def _values_in(value: Any) -> int:
    count = 0
    stack = [value]
    while stack:
        node = stack.pop()
        children: Any = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        count += len(children)
        stack.extend(child for child in children if isinstance(child, (dict, list)))
    return count


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
