from __future__ import annotations

import hashlib
import json

import pytest
from stream_factory import make_response, make_usage

from compliance import (
    ERRATA,
    EVENT_TYPES,
    SPEC_PATH,
    ConformanceError,
    load_spec,
    validate_compact,
    validate_error_body,
    validate_event,
    validate_response,
    validate_schema,
    validate_ws_error,
)
from compliance.schemas import Spec

PHASE_FIXTURE_OUTPUT = [
    {"id": "msg_phase_commentary", "type": "message", "status": "completed", "role": "assistant",
     "phase": "commentary", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
    {"id": "msg_phase_final", "type": "message", "status": "completed", "role": "assistant",
     "phase": "final_answer", "content": [{"type": "output_text", "text": "Four.", "annotations": []}]},
]


def raises(match: str):
    return pytest.raises(ConformanceError, match=match)


def test_document_loads_with_all_component_schemas():
    spec = load_spec()
    assert len(spec.schema_names) == 108
    assert tuple(spec.event_schemas) == EVENT_TYPES
    assert len(EVENT_TYPES) == 24


def test_errata_are_applied_in_memory_only():
    before = hashlib.sha256(SPEC_PATH.read_bytes()).hexdigest()
    spec = load_spec()
    assert spec.applied_errata == ERRATA
    assert all(erratum.reason for erratum in ERRATA)
    raw = json.loads(SPEC_PATH.read_text())
    assert raw["components"]["schemas"]["JsonSchemaResponseFormat"]["properties"]["schema"] == {
        "anyOf": [{"type": "null"}]}
    assert hashlib.sha256(SPEC_PATH.read_bytes()).hexdigest() == before


def test_explicit_path_is_accepted(tmp_path):
    copy = tmp_path / "openapi.json"
    copy.write_bytes(SPEC_PATH.read_bytes())
    spec = load_spec(copy)
    assert spec is not load_spec()
    spec.validate_response(make_response())


def test_a_fixed_document_is_left_alone():
    document = json.loads(SPEC_PATH.read_text())
    document["components"]["schemas"]["ReasoningItemParam"]["properties"]["content"] = {"type": "array"}
    spec = Spec(document)
    assert [erratum.pointer[2] for erratum in spec.applied_errata] == ["JsonSchemaResponseFormat"]


def test_valid_responses_pass():
    validate_response(make_response())
    validate_response(make_response(status="completed", completed_at=1, output=PHASE_FIXTURE_OUTPUT,
                                    usage=make_usage(), reasoning={"effort": None, "summary": None}))


def test_missing_required_field_names_the_field():
    response = make_response()
    del response["top_logprobs"]
    with raises(r"ResponseResource is invalid at \$: 'top_logprobs' is a required property"):
        validate_response(response)


def test_error_inside_a_union_reports_the_variant_named_by_type():
    response = make_response(output=[{"id": "msg_1", "type": "message", "status": "completed",
                                      "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}])
    with raises(r"at \$\.output\[0\]\.content\[0\]: 'annotations' is a required property") as caught:
        validate_response(response)
    assert caught.value.json_path == "$.output[0].content[0]"


def test_unknown_item_type_is_reported_at_the_item():
    response = make_response(output=[{"id": "x_1", "type": "acme:thing", "status": "completed"}])
    with raises(r"at \$\.output\[0\]: the object with type \"acme:thing\" matches none"):
        validate_response(response)


def test_reasoning_object_needs_both_keys():
    with raises(r"at \$\.reasoning"):
        validate_response(make_response(reasoning={}))


def test_json_schema_format_may_echo_the_real_schema():
    response = make_response(text={"format": {"type": "json_schema", "name": "answer", "description": None,
                                              "schema": {"type": "object"}, "strict": True}})
    validate_response(response)


def test_reasoning_item_param_may_carry_content():
    validate_schema("ReasoningItemParam", {"type": "reasoning", "summary": [],
                                           "content": [{"type": "reasoning_text", "text": "t"}]})


def test_events_validate_against_their_union_member():
    validate_event({"type": "response.output_text.delta", "sequence_number": 3, "item_id": "msg_1",
                    "output_index": 0, "content_index": 0, "delta": "hi"})
    with raises(r"'response.output_text.delta' event is invalid at \$\.delta: expected string, got 5"):
        validate_event({"type": "response.output_text.delta", "sequence_number": 3, "item_id": "msg_1",
                        "output_index": 0, "content_index": 0, "delta": 5})


def test_snapshot_events_validate_the_embedded_response():
    response = make_response()
    del response["top_logprobs"]
    with raises(r"at \$\.response: 'top_logprobs' is a required property"):
        validate_event({"type": "response.created", "sequence_number": 0, "response": response})


def test_unknown_and_extension_event_types_are_rejected():
    with raises(r"event type \"response.reasoning_text.delta\" is not one of the 24 event types"):
        validate_event({"type": "response.reasoning_text.delta", "sequence_number": 0})
    with raises("is not one of the 24 event types"):
        validate_event({"type": "acme:trace", "sequence_number": 0})
    with raises("must be a JSON object"):
        validate_event([])


def test_error_event_needs_all_four_error_keys():
    with raises(r"at \$\.error: 'param' is a required property"):
        validate_event({"type": "error", "sequence_number": 0,
                        "error": {"type": "server_error", "code": None, "message": "m"}})


def test_http_error_body():
    validate_error_body({"error": {"type": "invalid_request", "code": "model_not_found", "param": "model",
                                   "message": "no such model"}})
    validate_error_body({"error": {"type": "server_error", "code": None, "param": None, "message": "boom"}})
    with raises(r"at \$\.error: 'param' is a required property"):
        validate_error_body({"error": {"type": "server_error", "code": None, "message": "boom"}})
    with raises(r"at \$\.error\.code: expected string or null, got 400"):
        validate_error_body({"error": {"type": "server_error", "code": 400, "param": None, "message": "boom"}})
    with raises(r"at \$: 'error' is a required property"):
        validate_error_body({"detail": "not found"})


def test_websocket_error_envelope():
    validate_ws_error({"type": "error", "status": 400, "error": {
        "code": "previous_response_not_found", "message": "gone", "param": "previous_response_id"}})
    with raises(r"at \$: 'status' is a required property"):
        validate_ws_error({"type": "error", "error": {"code": "x", "message": "m"}})


def test_compact_resource():
    validate_compact({"id": "cmp_resp_1", "object": "response.compaction", "created_at": 1,
                      "output": [{"id": "cmp_1", "type": "compaction", "encrypted_content": "abc"}],
                      "usage": make_usage()})
    with raises(r"at \$\.object"):
        validate_compact({"id": "c", "object": "response", "created_at": 1, "output": [], "usage": make_usage()})


def test_unknown_schema_name_is_a_usage_error():
    with pytest.raises(ValueError, match="no component schema named 'Nope'"):
        validate_schema("Nope", {})
