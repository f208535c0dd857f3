"""Parsing request bodies into protocol models, with errors that name the ``param``.

Pydantic reports locations that mix JSON keys with the names of union members
(``('input', 2, 'user_message', 'content', 0, 'input_text', 'text')``). The param path is
recovered by walking the location alongside the raw JSON: a step that exists in the JSON
is kept, a union tag is skipped. Among several errors (a union reports one per member),
the one that reaches deepest into the JSON is the one the client needs to see.
"""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from app.errors import InvalidRequest

log = logging.getLogger("ors.request")

Model = TypeVar("Model", bound=BaseModel)


def decode_json(raw: bytes) -> Any:
    """The body as JSON, or a 400 that says where the JSON broke."""
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise InvalidRequest("The request body is not valid UTF-8.", code="invalid_json") from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"The request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}.",
            code="invalid_json",
        ) from None


def parse_body(model: type[Model], data: Any) -> Model:
    """Validate ``data`` into ``model``; unknown top-level fields are logged and ignored."""
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_type")
    unknown = sorted(set(data) - set(model.model_fields) - _aliases(model))
    if unknown:
        log.info("ignoring unknown top-level fields: %s", ", ".join(unknown))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise to_invalid_request(exc, data) from None


def _aliases(model: type[BaseModel]) -> set[str]:
    return {f.alias for f in model.model_fields.values() if f.alias}


def to_invalid_request(exc: ValidationError, data: Any) -> InvalidRequest:
    """The one error to report: the first in document order, skipping a union branch's
    "wrong type" complaint when another branch got further into the same value."""
    found: list[tuple[int, str, dict[str, Any]]] = []
    for error in exc.errors(include_url=False):
        depth, param = _param_path(error["loc"], data)
        if error["type"] in _TAG_ERRORS and isinstance(error.get("input"), dict):
            param = f"{param}.type" if param else "type"
            depth += 1
        found.append((depth, param, error))
    relevant = [
        entry
        for entry in found
        if not (
            entry[2]["type"].endswith("_type")
            and any(other[0] > entry[0] and other[1].startswith(entry[1]) for other in found)
        )
    ]
    _, param, error = (relevant or found)[0]
    code = _CODES.get(error["type"], "invalid_value")
    return InvalidRequest(_message(error, param), code=code, param=param or None)


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


def _message(error: dict[str, Any], param: str) -> str:
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
        got = value.get("type") if isinstance(value, dict) else value
        return f"Invalid value {got!r} for {where}: {error['msg']}."
    return f"Invalid value for {where}: {error['msg']}."


def _param_path(loc: tuple[Any, ...], data: Any) -> tuple[int, str]:
    """Map a pydantic location onto the raw JSON: (how deep it reached, dotted path)."""
    path = ""
    depth = 0
    node = data
    for step in loc:
        if isinstance(step, int) and isinstance(node, list) and 0 <= step < len(node):
            path += f"[{step}]"
            node = node[step]
            depth += 1
        elif isinstance(step, str) and isinstance(node, dict) and step in node:
            path = f"{path}.{step}" if path else step
            node = node[step]
            depth += 1
        elif isinstance(step, str) and isinstance(node, dict) and _is_field_name(step) and loc[-1] == step:
            # a missing required key (always the last step): named, but reaches no deeper
            path = f"{path}.{step}" if path else step
            node = None
    return depth, path


def _is_field_name(step: str) -> bool:
    return step.isidentifier() and not step[0].isupper()

