"""Parsing request bodies into protocol models, with errors that name the ``param``.

Pydantic reports locations that mix JSON keys with the names of union members
(``('input', 2, 'user_message', 'content', 0, 'input_text', 'text')``). Which steps are
union members is read off the model's own validation schema (pydantic-core's schema,
walked alongside the location): a member step is skipped, a field or index step is kept.
A tag can spell the same as a key of the JSON (``{"type": "function", "function": {...}}``,
a Chat Completions tool, fails with the location ``('tools', 0, 'function', 'name')``,
where ``function`` is the tag), so looking at the JSON alone cannot tell them apart. Then
the remaining steps are walked alongside the raw JSON to find how deep they reach. Among
several errors (a union reports one per member), the one that reaches deepest into the
JSON is the one the client needs to see.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import sys
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from app.engine.limits import RequestLimits, check_json_shape, too_deep
from app.errors import InvalidRequest
from app.protocol.items import MAX_ID_LENGTH

log = logging.getLogger("ors.request")

Model = TypeVar("Model", bound=BaseModel)
DEFAULT_LIMITS = RequestLimits()


def decode_json(raw: bytes | str, limits: RequestLimits = DEFAULT_LIMITS, *, what: str = "request body") -> Any:
    """The body (or a WebSocket frame: ``what``) as JSON, or a 400 that says where the JSON
    broke, that it nests deeper than ``limits.max_json_depth`` (``json_too_deep``, never a
    ``RecursionError``) or that it holds more than ``limits.max_json_values`` values
    (:func:`app.engine.limits.check_json_shape`).

    JSON as RFC 8259 has it, and nothing Python's own reader also takes: bytes are UTF-8
    (a leading byte order mark is ignored), strictly, so an encoded surrogate
    (``ED A0 80``) is an error rather than a lone surrogate that no later step could
    encode; ``NaN``, ``Infinity`` and ``-Infinity`` are not numbers (Python would read them
    and write them back out, as JSON no upstream or database reads), nor is a number
    beyond a double's range (``1e400``, read as infinity); an integer of more
    than 4,300 digits (Python's limit on reading one) is refused here, not by a 500."""
    try:
        if isinstance(raw, bytes):
            text = (raw[3:] if raw[:3] == _BOM else raw).decode()
        else:
            text = raw
        value = _DECODER.decode(text)
    except RecursionError:
        raise too_deep(limits.max_json_depth, _bytes(raw)) from None
    except UnicodeDecodeError:
        raise InvalidRequest(f"The {what} is not valid UTF-8.", code="invalid_json") from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"The {what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}.",
            code="invalid_json",
        ) from None
    except _NotANumber as exc:
        raise InvalidRequest(f"The {what} is not valid JSON: {exc}.", code="invalid_json") from None
    except ValueError:  # the one other thing the reader raises: an integer too long to read
        raise InvalidRequest(
            f"The {what} holds an integer of more than {sys.get_int_max_str_digits():,} digits.",
            code="invalid_json",
        ) from None
    if isinstance(value, (dict, list)):
        check_json_shape(value, raw, limits.max_json_depth, limits.max_json_values)
    escape = _SURROGATE_ESCAPE_TEXT if isinstance(raw, str) else _SURROGATE_ESCAPE
    if escape.search(raw):  # type: ignore[arg-type]
        value = _without_lone_surrogates(value)
    return value


class _NotANumber(ValueError):
    pass


def _not_a_number(constant: str) -> Any:
    raise _NotANumber(f"{constant} is not a JSON number")


def _finite(literal: str) -> float:
    number = float(literal)
    if math.isinf(number):
        raise _NotANumber(f"{literal[:32]} is beyond the range of a double")
    return number


_DECODER = json.JSONDecoder(parse_constant=_not_a_number, parse_float=_finite)
_BOM = b"\xef\xbb\xbf"


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_TEXT = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_lone_surrogates(value: Any) -> Any:
    """``value`` with each lone surrogate replaced by U+FFFD, as WHATWG's UTF-8 encoder
    (a browser's ``TextEncoder``) does. JSON can spell one (``"\\ud800"``, what a
    JavaScript string cut inside an emoji serializes to), Unicode text cannot hold one:
    nothing past this point could encode it as UTF-8 (the response's own JSON, the
    tokenizer, a grammar). A pair (``"\\ud83d\\ude00"``) is one character already."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        log.info("replaced lone surrogates in a request with U+FFFD")
        return json.loads(_LONE_SURROGATE.sub("\ufffd", text))
    return value


def _bytes(raw: bytes | str) -> bytes:
    return raw.encode(errors="replace") if isinstance(raw, str) else raw


def previous_response_of(data: dict[str, Any]) -> str | None:
    """The ``previous_response_id`` a request continues, checked before anything is loaded
    or generated: absent (or null), or a non-empty id. ``""`` is a 400 on the field, never
    "no previous response" here and a reference to a missing row in the store."""
    value = data.get("previous_response_id")
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_LENGTH:
        raise InvalidRequest(
            f"previous_response_id must be the id of a response (a string of 1 to {MAX_ID_LENGTH} characters), "
            "or absent.", code="invalid_value", param="previous_response_id")
    return value


def parse_body(model: type[Model], data: Any) -> Model:
    """Validate ``data`` into ``model``; unknown top-level fields are logged and ignored."""
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_type")
    unknown = data.keys() - _known_fields(model)
    if unknown:
        log.info("ignoring unknown top-level fields: %s", ", ".join(sorted(unknown)))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise to_invalid_request(exc, data, model) from None


@functools.cache
def _known_fields(model: type[BaseModel]) -> frozenset[str]:
    """A model's field names and aliases (made once per model)."""
    return frozenset(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}


def to_invalid_request(exc: ValidationError, data: Any, model: type[BaseModel] | None = None) -> InvalidRequest:
    """The one error to report: the first in document order, skipping a union branch's
    "wrong type" complaint when another branch got further into the same value."""
    found: list[tuple[int, str, ErrorDetails, Any]] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        depth, param, holder = _param_path(_data_steps(model, loc) if model is not None else loc, data)
        if error["type"] in _TAG_ERRORS and isinstance(error.get("input"), dict):
            param = f"{param}.type" if param else "type"
            depth += 1
        found.append((depth, param, error, holder))
    relevant = [
        entry
        for entry in found
        if not (
            _wrong_type(entry[2])
            and any((other[0], len(other[1])) > (entry[0], len(entry[1])) and other[1].startswith(entry[1])
                    for other in found)
        )
    ]
    _, param, error, holder = (relevant or found)[0]
    code = _CODES.get(error["type"], "invalid_value")
    return InvalidRequest(_message(error, param) + _chat_completions_hint(holder), code=code, param=param or None)


def _wrong_type(error: Mapping[str, Any]) -> bool:
    """A union member's complaint that the value is of another kind altogether (a string
    or literal expected where an object was sent): another member may explain it better."""
    return error["type"].endswith("_type") or (
        error["type"] == "literal_error" and isinstance(error.get("input"), dict | list)
    )


def _chat_completions_hint(holder: Any) -> str:
    """For an object in the Chat Completions shape (``{"type": "function", "function":
    {...}}``), how the Responses API spells it instead."""
    if not (isinstance(holder, dict) and holder.get("type") == "function" and isinstance(holder.get("function"), dict)):
        return ""
    return (
        ' This is the Chat Completions shape ({"type": "function", "function": {...}}); in the Responses API '
        'function tools and tool choices are flat: {"type": "function", "name": ..., "parameters": ...} for a '
        'tool, {"type": "function", "name": ...} for tool_choice.'
    )


_TAG_ERRORS = ("unknown_item_type", "union_tag_invalid", "union_tag_not_found")

_CODES = {
    "missing": "missing_required_parameter",
    "extra_forbidden": "unknown_parameter",
    "unknown_item_type": "invalid_type",
    "union_tag_invalid": "invalid_type",
    "union_tag_not_found": "invalid_type",
    "literal_error": "invalid_value",
    "string_too_long": "string_above_max_length",
    "too_long": "array_above_max_length",
    "too_short": "array_below_min_length",
}


def _message(error: Mapping[str, Any], param: str) -> str:
    where = f"'{param}'" if param else "the request body"
    kind = error["type"]
    if kind == "missing":
        return f"Missing required parameter: {where}."
    if kind == "extra_forbidden":
        return f"Unknown parameter: {where}."
    if kind in _TAG_ERRORS:
        value = error.get("input")
        if not isinstance(value, dict):
            return f"Invalid value for {where}: expected an object with a 'type', got {type(value).__name__}."
        return f"Invalid value {_shown(value.get('type'))} for {where}: {error['msg']}."
    return f"Invalid value for {where}: {error['msg']}."


_MAX_SHOWN = 80
"""The most of a client's value an error message repeats."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 1] + "…"


def _param_path(loc: tuple[Any, ...], data: Any) -> tuple[int, str, Any]:
    """Map a pydantic location onto the raw JSON: (how deep it reached, dotted path, the
    JSON object that holds the last step)."""
    path = ""
    depth = 0
    node = data
    holder: Any = None
    for step in loc:
        if isinstance(step, int) and isinstance(node, list) and 0 <= step < len(node):
            path += f"[{step}]"
            holder, node = node, node[step]
            depth += 1
        elif isinstance(step, str) and isinstance(node, dict) and step in node:
            path = f"{path}.{step}" if path else step
            holder, node = node, node[step]
            depth += 1
        elif isinstance(step, str) and isinstance(node, dict) and _is_field_name(step) and loc[-1] == step:
            # a missing required key (always the last step): named, but reaches no deeper
            path = f"{path}.{step}" if path else step
            holder, node = node, None
    return depth, path, holder


def _is_field_name(step: str) -> bool:
    return step.isidentifier() and not step[0].isupper()


# ---------------------------------------------------------------- which steps are data


def _data_steps(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """``loc`` without the steps that name union members, by the model's core schema;
    ``loc`` unchanged when the schema cannot account for it."""
    kinds = _classify(_core(model), loc, 0, _definitions(model))
    if kinds is None:
        return loc
    return tuple(step for step, is_data in zip(loc, kinds, strict=False) if is_data)


@lru_cache(maxsize=32)
def _definitions(model: type[BaseModel]) -> Mapping[str, Any]:
    found: dict[str, Any] = {}

    def collect(schema: Any) -> None:
        if isinstance(schema, dict):
            if schema.get("type") == "definitions":
                for definition in schema["definitions"]:
                    found[definition["ref"]] = definition
            for value in schema.values():
                collect(value)
        elif isinstance(schema, list | tuple):
            for value in schema:
                collect(value)

    collect(_core(model))
    return found


def _core(model: type[BaseModel]) -> Mapping[str, Any]:
    return model.__pydantic_core_schema__


_WRAPPERS = frozenset({
    "definitions", "model", "default", "nullable", "function-after", "function-before", "function-wrap",
    "json-or-python", "lax-or-strict",
})


def _classify(schema: Mapping[str, Any], loc: Sequence[Any], at: int, refs: Mapping[str, Any]) -> list[bool] | None:
    """For ``loc[at:]``, whether each step is a key or index of the data (``True``) or a
    union member's name (``False``); ``None`` if ``schema`` does not fit the steps."""
    if at == len(loc):
        return []
    kind = schema.get("type")
    step = loc[at]
    if kind == "definition-ref":
        target = refs.get(schema["schema_ref"])
        return None if target is None else _classify(target, loc, at, refs)
    if kind in ("json-or-python", "lax-or-strict"):
        inner = schema.get("python_schema") or schema.get("strict_schema") or schema.get("schema")
        return None if inner is None else _classify(inner, loc, at, refs)
    if kind in _WRAPPERS and "schema" in schema:
        return _classify(schema["schema"], loc, at, refs)
    if kind == "model-fields":
        for name, field in schema["fields"].items():
            if step in (name, field.get("validation_alias"), field.get("serialization_alias")):
                rest = _classify(field["schema"], loc, at + 1, refs)
                return None if rest is None else [True, *rest]
        return [True] * (len(loc) - at)  # an unknown key (extra_forbidden): data all the way
    if kind in ("list", "set", "frozenset", "tuple") and isinstance(step, int):
        items = schema.get("items_schema")
        if isinstance(items, list):  # positional tuple
            items = items[step] if step < len(items) else None
        rest = _classify(items, loc, at + 1, refs) if isinstance(items, dict) else [True] * (len(loc) - at - 1)
        return None if rest is None else [True, *rest]
    if kind == "dict":
        values = schema.get("values_schema")
        rest = _classify(values, loc, at + 1, refs) if isinstance(values, dict) else [True] * (len(loc) - at - 1)
        return None if rest is None else [True, *rest]
    if kind == "tagged-union":
        choice = schema["choices"].get(step)
        if choice is None:
            return None
        rest = _classify(choice, loc, at + 1, refs)
        return None if rest is None else [False, *rest]
    if kind == "union":
        for choice in schema["choices"]:
            member, label = (choice if isinstance(choice, tuple | list) else (choice, None))
            if label is not None and label != step:
                continue
            rest = _classify(member, loc, at + 1, refs)
            if rest is not None:
                return [False, *rest]
        return None
    if kind in ("any", "dict", "json"):
        return [True] * (len(loc) - at)
    return None

