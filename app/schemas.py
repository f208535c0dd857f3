"""JSON Schema, compiled once for every user: the replay gate, the strict ``text.format``
check and the strict tools' arguments check. This is the one module that compiles a
schema (and the only one that knows the ``jsonschema`` library); the embedded model's
grammar conversion (:mod:`app.backends.grammar`) only ever sees a schema admitted here.

A schema from a request is *admitted* here before anything uses it. Admission checks, in
this order, and reports the first problem as a sentence (:class:`Compiled.problem`):

1. **size**: its canonical JSON is at most ``SchemaLimits.max_bytes``;
2. **depth**: objects and arrays nest at most ``SchemaLimits.max_depth`` deep;
3. **references stay inside the document**: every ``$ref`` and ``$dynamicRef`` starts
   with ``#``. Nothing is ever fetched (the registry refuses retrieval as well), so a
   schema cannot make the server open a URL or a file;
4. **Draft 2020-12**: the schema is valid against the meta-schema;
5. **patterns run in linear time**: every ``pattern`` and ``patternProperties`` key
   compiles under RE2, which never backtracks. Lookaround and backreferences, which RE2
   cannot run in linear time, are refused with a sentence that says so. A schema that
   combines ``unevaluatedProperties`` with ``patternProperties`` is refused too: the
   library evaluates that pair with Python's backtracking ``re``.

Validation uses a Draft 2020-12 validator whose ``pattern``, ``patternProperties`` and
``additionalProperties`` keywords match with RE2. Compiled schemas are cached by their
canonical JSON (an LRU), so the same tool definition sent with every turn of an agent is
compiled once. Compiling and validating are CPU work: the engine runs them in a worker
thread, never on the event loop; with RE2 no pattern runs longer than linear time in its
input, so a thread is never held hostage either.

A ``$ref`` inside the document that points at nothing is not an admission problem: it
is found when validation reaches it, and :meth:`Compiled.first_error` then raises
:class:`UnresolvedReference`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import re2
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

DEFAULT_MAX_SCHEMA_BYTES = 256 * 1024
DEFAULT_MAX_SCHEMA_DEPTH = 64

_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
"""Keywords whose values are data, not schemas: a ``$ref`` inside them is not a reference."""

_REF_KEYWORDS = ("$ref", "$dynamicRef")


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES
    max_depth: int = DEFAULT_MAX_SCHEMA_DEPTH


class UnresolvedReference(Exception):
    """A reference of the schema that resolves to nothing (``#/$defs/missing``), met
    while validating; ``ref`` is the reference as the resolver saw it."""

    def __init__(self, ref: str) -> None:
        super().__init__(ref)
        self.ref = ref


@dataclass(frozen=True, slots=True)
class Compiled:
    """A schema as admitted: its validator, or the sentence that says why it has none."""

    validator: Draft202012Validator | None
    problem: str | None = None
    depth: int = 0
    """How deep objects and arrays nest in the schema document."""

    def first_error(self, instance: Any) -> ValidationError | None:
        """The most relevant way ``instance`` fails the schema, or ``None`` when it
        matches. Raises ``UnresolvedReference`` when validation meets a reference that
        resolves to nothing, ``RecursionError`` for an instance nested beyond Python's
        stack."""
        assert self.validator is not None, "a schema with a problem validates nothing"
        try:
            return best_match(self.validator.iter_errors(instance))
        except Unresolvable as exc:
            raise UnresolvedReference(getattr(exc, "ref", None) or str(exc)) from exc


def canonical(schema: Any) -> str:
    """The cache key of a schema: its JSON with sorted keys and no spaces."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def compile_schema(schema: Any, limits: SchemaLimits = SchemaLimits()) -> Compiled:
    """The admitted form of ``schema`` under ``limits`` (see the module docstring)."""
    try:
        key = canonical(schema)
    except (TypeError, ValueError, RecursionError):
        return Compiled(None, "the schema is not JSON, or is nested too deeply")
    size = len(key.encode("utf-8", "surrogatepass"))  # JSON may hold a lone surrogate ("\\ud800")
    if size > limits.max_bytes:
        return Compiled(None, f"the schema is {size:,} bytes, more than this server's limit of "
                              f"{limits.max_bytes:,} (ORS_MAX_SCHEMA_BYTES)")
    compiled = _compile(key)
    if compiled.depth > limits.max_depth:
        return Compiled(None, f"the schema nests {compiled.depth} deep, more than this server's "
                              f"limit of {limits.max_depth} (ORS_MAX_SCHEMA_DEPTH)", compiled.depth)
    return compiled


def admitted(schema: Any) -> Compiled:
    """The compiled form of a schema that :func:`compile_schema` admitted earlier (the
    strict output check runs against the schema the request's admission compiled)."""
    return _compile(canonical(schema))


def json_path(error: ValidationError) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)


# ---------------------------------------------------------------- admission


@lru_cache(maxsize=1024)
def _compile(key: str) -> Compiled:
    """Everything about a schema that does not depend on the limits, once per schema."""
    try:
        schema = json.loads(key)
    except RecursionError:
        return Compiled(None, "the schema is nested too deeply", 10**6)
    depth, problem = _walk(schema)
    if problem is not None:
        return Compiled(None, problem, depth)
    try:
        _Validator.check_schema(schema)
    except SchemaError as exc:
        return Compiled(None, f"{exc.json_path}: {_clip(exc.message)}", depth)
    except RecursionError:
        return Compiled(None, "the schema is nested too deeply", depth)
    return Compiled(_Validator(schema, registry=_OFFLINE), None, depth)


def _walk(schema: Any) -> tuple[int, str | None]:
    """The depth of the document, and the first problem with its references or patterns;
    one iterative walk (no recursion to exhaust)."""
    uses_unevaluated = uses_pattern_properties = False
    deepest = 0
    problem: str | None = None
    stack: list[tuple[Any, str, int, bool]] = [(schema, "$", 1, True)]
    while stack:
        node, where, depth, is_schema = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, list):
            stack.extend((value, f"{where}[{i}]", depth + 1, is_schema) for i, value in enumerate(node))
            continue
        if not isinstance(node, Mapping):
            continue
        if is_schema and problem is None:
            for keyword in _REF_KEYWORDS:
                ref = node.get(keyword)
                if isinstance(ref, str) and not ref.startswith("#"):
                    problem = (f"{where}.{keyword} is {_clip(ref)!r}, which points outside the schema: "
                               "references resolve within the document only (nothing is fetched). "
                               "Put the definition under $defs and refer to it as '#/$defs/...'")
            pattern = node.get("pattern")
            if isinstance(pattern, str) and (refused := _pattern_problem(pattern)) is not None:
                problem = problem or f"{where}.pattern {_clip(pattern)!r} {refused}"
            properties = node.get("patternProperties")
            if isinstance(properties, Mapping):
                uses_pattern_properties = True
                for key in properties:
                    if (refused := _pattern_problem(key)) is not None:
                        problem = problem or f"{where}.patternProperties key {_clip(key)!r} {refused}"
            if "unevaluatedProperties" in node:
                uses_unevaluated = True
        for key, value in node.items():
            if isinstance(value, (Mapping, list)):
                stack.append((value, f"{where}.{key}", depth + 1, is_schema and key not in _DATA_KEYWORDS))
    if problem is None and uses_unevaluated and uses_pattern_properties:
        problem = ("the schema combines unevaluatedProperties with patternProperties, which this "
                   "server cannot evaluate in linear time; use additionalProperties instead")
    return deepest, problem


def _pattern_problem(pattern: str) -> str | None:
    try:
        _re2(pattern)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        return (f"cannot run in linear time ({reason}): lookaround and backreferences are not "
                "supported in patterns")
    return None


# ---------------------------------------------------------------- RE2 keywords


def _re2_options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the client's error, reported to it
    return options


_RE2_OPTIONS = _re2_options()


@lru_cache(maxsize=4096)
def _re2(pattern: str) -> Any:
    return re2.compile(pattern, _RE2_OPTIONS)


def _matches(pattern: str, text: str) -> bool:
    return _re2(pattern).search(text) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _matches(pattern, instance):
        yield ValidationError(f"{_clip(instance)!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _matches(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [key for key in instance
              if key not in properties and not any(_matches(p, key) for p in patterns)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        shown = ", ".join(repr(each) for each in sorted(extras, key=str))
        yield ValidationError(f"Additional properties are not allowed ({shown} unexpected)")


_Validator = validators.extend(
    Draft202012Validator,
    validators={
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)


def _refuse_retrieval(uri: str) -> Any:
    raise NoSuchResource(ref=uri)


_OFFLINE = Registry(retrieve=_refuse_retrieval)
"""References resolve within the schema (and the meta-schemas) only; nothing is fetched."""

_MAX_SHOWN = 200


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "…"
