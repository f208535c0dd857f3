"""JSON Schema validation against the vendored Open Responses OpenAPI document.

The document (``openapi/openapi.json`` at the repository root, OpenAPI 3.1) is loaded
once, patched in memory for the known errata of the published release (``ERRATA``), and
its component schemas are compiled into Draft 2020-12 validators on first use. A
``referencing.Registry`` holds the whole document, so ``#/components/schemas/X``
references resolve exactly as written.

Every ``validate_*`` function returns ``None`` on success and raises
``ConformanceError`` otherwise. The message names what was validated, the JSON path of
the most specific problem (``$.output[0].content[0]``) and what is wrong there. Unions
that the OpenAPI document discriminates on ``type`` are resolved the same way when an
error is reported: the variant whose ``type`` matches the instance is the one whose
error is shown.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, relevance
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from compliance.errors import ConformanceError

SPEC_PATH = Path(__file__).resolve().parent.parent / "openapi" / "openapi.json"
"""The vendored OpenAPI document, located relative to this package."""

_DOCUMENT_URI = "urn:openresponses:openapi"
_STREAM_UNION_POINTER = (
    "paths", "/responses", "post", "responses", "200", "content", "text/event-stream", "schema",
)

EVENT_TYPES: tuple[str, ...] = (
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "response.output_item.added",
    "response.output_item.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_part.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.refusal.delta",
    "response.refusal.done",
    "response.reasoning.delta",
    "response.reasoning.done",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_text.done",
    "response.output_text.annotation.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "error",
)
"""The 24 event types of the ``text/event-stream`` union of release 2026-04-24, in document order."""


@dataclass(frozen=True)
class Erratum:
    """A correction applied to the in-memory copy of the document.

    ``pointer`` locates the schema to replace. The replacement is applied only while the
    schema still has its known erroneous value ``erroneous``; a document that has been
    fixed upstream is left as it is.
    """

    pointer: tuple[str, ...]
    erroneous: Any
    replacement: Any
    reason: str


_NULL_ONLY = {"anyOf": [{"type": "null"}]}

ERRATA: tuple[Erratum, ...] = (
    Erratum(
        pointer=("components", "schemas", "JsonSchemaResponseFormat", "properties", "schema"),
        erroneous=_NULL_ONLY,
        replacement={"anyOf": [{"type": "object"}, {"type": "null"}]},
        reason="the generator dropped the 'any' branch, so a server could not echo the JSON schema it was given",
    ),
    Erratum(
        pointer=("components", "schemas", "ReasoningItemParam", "properties", "content"),
        erroneous=_NULL_ONLY,
        replacement={"anyOf": [{"type": "array"}, {"type": "null"}]},
        reason="the generator dropped the array branch, so reasoning content could not be sent back as input",
    ),
)
"""Known defects of the published document and how they are corrected in memory."""

ERROR_BODY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["type", "code", "param", "message"],
            "properties": {
                "type": {"type": "string"},
                "code": {"type": ["string", "null"]},
                "param": {"type": ["string", "null"]},
                "message": {"type": "string"},
            },
        },
    },
}
"""The HTTP error body ``{"error": {type, code, param, message}}``: the prose defines it, the document has no schema."""


class Spec:
    """One loaded, erratum-patched OpenAPI document with cached compiled validators."""

    def __init__(self, document: Mapping[str, Any], *, source: str = "<memory>") -> None:
        self.source = source
        self.document, self.applied_errata = _apply_errata(document)
        resource = DRAFT202012.create_resource(self.document)
        self._registry = Registry().with_resource(_DOCUMENT_URI, resource)
        self._validators: dict[str, Draft202012Validator] = {}
        self.event_schemas = _event_schema_names(self.document)
        self._union_is_discriminated = _is_discriminated(self.document, self.event_schemas)

    @property
    def schema_names(self) -> tuple[str, ...]:
        """The names of all component schemas, in document order."""
        return tuple(self.document["components"]["schemas"])

    def validator(self, name: str) -> Draft202012Validator:
        """The compiled validator for component schema ``name`` (``ValueError`` if it does not exist)."""
        cached = self._validators.get(name)
        if cached is None:
            if name not in self.document["components"]["schemas"]:
                raise ValueError(f"no component schema named {name!r} in {self.source}")
            cached = self._compile({"$ref": f"{_DOCUMENT_URI}#/components/schemas/{name}"})
            self._validators[name] = cached
        return cached

    def validate(self, name: str, instance: Any, *, label: str | None = None) -> None:
        """Validate ``instance`` against component schema ``name``."""
        _raise_first_error(self.validator(name), instance, label or name)

    def validate_response(self, instance: Any) -> None:
        """Validate a ``ResponseResource`` (the non-streaming body and every event snapshot)."""
        self.validate("ResponseResource", instance)

    def validate_compact(self, instance: Any) -> None:
        """Validate a ``CompactResource`` (the body of ``POST /responses/compact``)."""
        self.validate("CompactResource", instance)

    def validate_ws_error(self, instance: Any) -> None:
        """Validate a ``WebSocketErrorEvent`` envelope."""
        self.validate("WebSocketErrorEvent", instance)

    def validate_error_body(self, instance: Any) -> None:
        """Validate an HTTP error body against ``ERROR_BODY_SCHEMA``."""
        validator = self._validators.get("#error-body")
        if validator is None:
            validator = self._validators["#error-body"] = self._compile(ERROR_BODY_SCHEMA)
        _raise_first_error(validator, instance, "HTTP error body")

    def validate_event(self, event: Any) -> None:
        """Validate one streaming event against the ``text/event-stream`` union.

        The event must be a JSON object whose ``type`` is one of the union's event
        types, and it must match exactly one member of the union.
        """
        if not isinstance(event, dict):
            raise ConformanceError(f"a streaming event must be a JSON object, got {_short(event)}")
        event_type = event.get("type")
        schema_name = self.event_schemas.get(event_type) if isinstance(event_type, str) else None
        if schema_name is None:
            raise ConformanceError(
                f"event type {_short(event_type)} is not one of the {len(self.event_schemas)} event types "
                f"of the streaming union ({', '.join(self.event_schemas)})",
                json_path="$.type",
            )
        self.validate(schema_name, event, label=f"{event_type!r} event")
        if not self._union_is_discriminated:
            _raise_first_error(self._stream_union_validator(), event, f"{event_type!r} event")

    def required_fields(self, name: str) -> tuple[str, ...]:
        """The ``required`` list of component schema ``name``."""
        return tuple(self.document["components"]["schemas"][name].get("required", ()))

    def _stream_union_validator(self) -> Draft202012Validator:
        cached = self._validators.get("#stream-union")
        if cached is None:
            pointer = "/".join(part.replace("~", "~0").replace("/", "~1") for part in _STREAM_UNION_POINTER)
            cached = self._validators["#stream-union"] = self._compile({"$ref": f"{_DOCUMENT_URI}#/{pointer}"})
        return cached

    def _compile(self, schema: Mapping[str, Any]) -> Draft202012Validator:
        return Draft202012Validator(schema, registry=self._registry)


def with_items(spec: Spec, items: Mapping[str, Mapping[str, Any]],
               events: Mapping[str, Mapping[str, Any]] | None = None) -> Spec:
    """``spec`` with further item schemas in its item union (``ItemField``), for judging
    a server's documented superset items (``name`` to schema) by every other rule of the
    spec: in responses, in events, in the stream's lifecycle; and ``events``, further
    event schemas in its streaming union (the stream checker knows which superset events
    it may meet). A name the spec already has is a ``ValueError``: a superset adds, it
    never redefines."""
    document = copy.deepcopy(dict(spec.document))
    schemas = document["components"]["schemas"]
    union = document
    for key in _STREAM_UNION_POINTER:
        union = union[key]
    for added, target in ((items, schemas["ItemField"]["oneOf"]), (events or {}, union["oneOf"])):
        for name, schema in added.items():
            if name in schemas:
                raise ValueError(f"the spec already defines {name!r}")
            schemas[name] = dict(schema)
            target.append({"$ref": f"#/components/schemas/{name}"})
    return Spec(document, source=f"{spec.source} with {', '.join([*items, *(events or {})])}")


@functools.cache
def _load_spec_cached(resolved_path: str) -> Spec:
    with open(resolved_path, encoding="utf-8") as handle:
        document = json.load(handle)
    return Spec(document, source=resolved_path)


def load_spec(path: str | os.PathLike[str] | None = None) -> Spec:
    """Load (once per path) the OpenAPI document at ``path``, by default the vendored one."""
    return _load_spec_cached(str(Path(path or SPEC_PATH).resolve()))


def validate_response(obj: Any, *, spec: Spec | None = None) -> None:
    """Validate a ``ResponseResource``."""
    (spec or load_spec()).validate_response(obj)


def validate_event(obj: Any, *, spec: Spec | None = None) -> None:
    """Validate one streaming event against the ``text/event-stream`` union."""
    (spec or load_spec()).validate_event(obj)


def validate_compact(obj: Any, *, spec: Spec | None = None) -> None:
    """Validate a ``CompactResource``."""
    (spec or load_spec()).validate_compact(obj)


def validate_ws_error(obj: Any, *, spec: Spec | None = None) -> None:
    """Validate a ``WebSocketErrorEvent``."""
    (spec or load_spec()).validate_ws_error(obj)


def validate_error_body(obj: Any, *, spec: Spec | None = None) -> None:
    """Validate an HTTP error body ``{"error": {type, code, param, message}}``."""
    (spec or load_spec()).validate_error_body(obj)


def validate_schema(name: str, obj: Any, *, spec: Spec | None = None) -> None:
    """Validate ``obj`` against the component schema called ``name``."""
    (spec or load_spec()).validate(name, obj)


def _apply_errata(document: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[Erratum, ...]]:
    patched = copy.deepcopy(dict(document))
    applied = []
    for erratum in ERRATA:
        parent = patched
        for key in erratum.pointer[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
            if parent is None:
                break
        if isinstance(parent, dict) and parent.get(erratum.pointer[-1]) == erratum.erroneous:
            parent[erratum.pointer[-1]] = copy.deepcopy(erratum.replacement)
            applied.append(erratum)
    return patched, tuple(applied)


def _event_schema_names(document: Mapping[str, Any]) -> dict[str, str]:
    """Map each event ``type`` of the streaming union to its component schema name."""
    union = document
    for key in _STREAM_UNION_POINTER:
        union = union[key]
    names: dict[str, str] = {}
    for member in union["oneOf"]:
        name = member["$ref"].rsplit("/", 1)[-1]
        for event_type in document["components"]["schemas"][name]["properties"]["type"].get("enum", ()):
            names.setdefault(event_type, name)
    return names


def _is_discriminated(document: Mapping[str, Any], event_schemas: Mapping[str, str]) -> bool:
    """True when every union member requires ``type`` and pins it to its own single value.

    Then an event can match at most one member, and validating it against the member
    named by its ``type`` is equivalent to validating it against the ``oneOf``.
    """
    schemas = document["components"]["schemas"]
    for name in set(event_schemas.values()):
        schema = schemas[name]
        type_schema = schema.get("properties", {}).get("type", {})
        if "type" not in schema.get("required", ()) or len(type_schema.get("enum", ())) != 1:
            return False
    return len(set(event_schemas.values())) == len(event_schemas)


def _raise_first_error(validator: Draft202012Validator, instance: Any, label: str) -> None:
    errors = list(validator.iter_errors(instance))
    if not errors:
        return
    error = _most_specific(max(errors, key=relevance))
    path = error.json_path
    raise ConformanceError(f"{label} is invalid at {path}: {_describe(error)}", json_path=path)


def _most_specific(error: ValidationError) -> ValidationError:
    """Descend from a failed ``oneOf``/``anyOf`` into the variant the instance was meant to be.

    A variant is ruled out when it fails on the instance's JSON type or on the value of
    its ``type`` property; when exactly one variant remains, its most relevant error is
    the one reported.
    """
    while error.validator in ("oneOf", "anyOf") and error.context:
        by_variant: dict[Any, list[ValidationError]] = {}
        for sub_error in error.context:
            by_variant.setdefault(sub_error.relative_schema_path[0], []).append(sub_error)
        remaining = [errs for errs in by_variant.values() if not any(_rules_out_variant(e) for e in errs)]
        if len(remaining) != 1:
            return error
        error = max(remaining[0], key=relevance)
    return error


def _rules_out_variant(error: ValidationError) -> bool:
    path = list(error.relative_path)
    if error.validator == "type" and not path:
        return True
    return path == ["type"] and error.validator in ("enum", "const")


def _describe(error: ValidationError) -> str:
    instance = error.instance
    if error.validator in ("oneOf", "anyOf"):
        if not error.context:
            return f"{_short(instance)} matches more than one variant of a oneOf"
        if isinstance(instance, dict) and "type" in instance:
            return f"the object with type {_short(instance['type'])} matches none of the allowed variants"
        return f"{_short(instance)} matches none of the allowed variants"
    if error.validator == "type":
        return f"expected {_expected_types(error.validator_value)}, got {_short(instance)}"
    if error.validator == "enum":
        return f"{_short(instance)} is not one of {_short(error.validator_value, 200)}"
    if error.validator == "const":
        return f"{_short(instance)} is not {_short(error.validator_value)}"
    if error.validator in ("required", "additionalProperties", "dependentRequired"):
        return error.message
    return _clip(error.message, 200)


def _expected_types(value: str | Iterable[str]) -> str:
    return value if isinstance(value, str) else " or ".join(value)


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return _clip(text, limit)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
