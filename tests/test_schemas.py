"""app.schemas: admission (size, depth, references, patterns, Draft 2020-12) and
validation with RE2 patterns."""

from __future__ import annotations

import pytest

from app.schemas import SchemaLimits, UnresolvedReference, admitted, compile_schema


def nested(depth: int) -> dict[str, object]:
    schema: dict[str, object] = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"items": schema}
    return schema


def test_a_plain_schema_validates() -> None:
    compiled = compile_schema({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    assert compiled.problem is None
    assert compiled.first_error({"n": 1}) is None
    error = compiled.first_error({"n": "one"})
    assert error is not None and "not of type 'integer'" in error.message


@pytest.mark.parametrize("ref", ["http://127.0.0.1:9/x.json", "https://example.com/s#/a", "file:///etc/passwd",
                                 "other.json", "urn:example:thing"])
def test_references_outside_the_document_are_refused(ref: str) -> None:
    compiled = compile_schema({"type": "object", "properties": {"a": {"$ref": ref}}})
    assert compiled.validator is None and compiled.problem is not None
    assert "$.properties.a.$ref" in compiled.problem and ref in compiled.problem


def test_dynamic_refs_are_held_to_the_same_rule() -> None:
    assert compile_schema({"$dynamicRef": "http://x/y"}).problem is not None


def test_local_references_resolve() -> None:
    compiled = compile_schema({"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}})
    assert compiled.problem is None
    assert compiled.first_error({"a": "x"}) is not None and compiled.first_error({"a": 2}) is None


def test_a_local_reference_to_nothing_is_reported_when_validation_meets_it() -> None:
    compiled = compile_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})
    assert compiled.problem is None
    assert compiled.first_error({}) is None
    with pytest.raises(UnresolvedReference) as raised:
        compiled.first_error({"a": 1})
    assert "missing" in raised.value.ref


def test_a_ref_inside_data_keywords_is_data() -> None:
    schema = {"const": {"$ref": "http://x"}, "enum": [{"$ref": "http://y"}], "default": {"$ref": "http://z"}}
    assert compile_schema(schema).problem is None


def test_size_limit() -> None:
    schema = {"type": "object", "description": "x" * 100}
    assert compile_schema(schema, SchemaLimits(max_bytes=1000)).problem is None
    problem = compile_schema(schema, SchemaLimits(max_bytes=50)).problem
    assert problem is not None and "ORS_MAX_SCHEMA_BYTES" in problem


def test_depth_limit() -> None:
    assert compile_schema(nested(10), SchemaLimits(max_depth=10)).problem is None
    problem = compile_schema(nested(11), SchemaLimits(max_depth=10)).problem
    assert problem is not None and "ORS_MAX_SCHEMA_DEPTH" in problem


def test_invalid_draft_2020_12() -> None:
    problem = compile_schema({"type": "objectx"}).problem
    assert problem is not None and problem.startswith("$.type")


def test_pattern_matches_with_re2() -> None:
    compiled = compile_schema({"type": "string", "pattern": "^[a-z]+-[0-9]{2}$"})
    assert compiled.first_error("abc-12") is None
    assert compiled.first_error("abc-123") is not None


def test_catastrophic_pattern_is_linear() -> None:
    # Exponential in Python's `re`; pytest-timeout fails the test if it backtracks.
    compiled = compile_schema({"type": "string", "pattern": "^(a+)+$"})
    assert compiled.first_error("a" * 100_000 + "!") is not None
    assert compiled.first_error("a" * 100_000) is None


def test_pattern_properties_and_additional_properties_use_re2() -> None:
    compiled = compile_schema({"type": "object", "patternProperties": {"^(a+)+$": {"type": "integer"}},
                               "additionalProperties": False})
    assert compiled.first_error({"aaa": 1}) is None
    assert compiled.first_error({"aaa": "x"}) is not None
    error = compiled.first_error({"a" * 50_000 + "!": 1})
    assert error is not None and "Additional properties are not allowed" in error.message


def test_additional_properties_schema() -> None:
    compiled = compile_schema({"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}})
    assert compiled.first_error({"a": "x", "b": 2}) is None
    assert compiled.first_error({"b": "x"}) is not None


@pytest.mark.parametrize("pattern", ["^(?=a)", "(?<!x)y", "(a)\\1"])
def test_patterns_re2_cannot_run_are_refused(pattern: str) -> None:
    problem = compile_schema({"type": "string", "pattern": pattern}).problem
    assert problem is not None and "linear time" in problem


def test_unevaluated_properties_with_pattern_properties_is_refused() -> None:
    problem = compile_schema({"patternProperties": {"^a": {}}, "unevaluatedProperties": False}).problem
    assert problem is not None and "unevaluatedProperties" in problem
    assert compile_schema({"properties": {"a": {}}, "unevaluatedProperties": False}).problem is None


def test_compiled_once_and_admitted_is_the_same_object() -> None:
    schema = {"type": "object", "properties": {"z": {"type": "boolean"}}}
    first = compile_schema(schema)
    assert compile_schema({"properties": {"z": {"type": "boolean"}}, "type": "object"}) is first
    assert admitted(schema) is first


def test_not_json() -> None:
    assert compile_schema({"a": {1, 2}}).problem is not None
