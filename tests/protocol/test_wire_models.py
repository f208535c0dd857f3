"""The wire models agree with the vendored spec (checked by the independent oracle)."""

from __future__ import annotations

import json

from app.engine.echo import initial_response
from app.protocol.content import OutputText
from app.protocol.events import event_type_names
from app.protocol.items import Message, Reasoning
from app.protocol.responses import CreateResponseBody
from compliance import EVENT_TYPES, load_spec, validate_response


def test_the_24_event_types_are_the_spec_s() -> None:
    assert sorted(event_type_names()) == sorted(EVENT_TYPES)


def test_initial_response_has_all_31_fields_and_validates() -> None:
    body = CreateResponseBody.model_validate({"model": "m", "input": "hi"})
    wire = json.loads(initial_response(body, response_id="resp_1", model="m").model_dump_json())
    assert len(wire) == 31
    assert set(load_spec().required_fields("ResponseResource")) == set(wire)
    validate_response(wire)


def test_required_nullable_fields_are_written_as_null() -> None:
    body = CreateResponseBody.model_validate({"input": "hi"})
    wire = json.loads(initial_response(body, response_id="resp_1", model="m").model_dump_json())
    for name in ("completed_at", "incomplete_details", "error", "usage", "instructions", "previous_response_id"):
        assert name in wire and wire[name] is None


def test_optional_fields_are_left_out_when_unset() -> None:
    assert json.loads(OutputText(text="x").model_dump_json()) == {"type": "output_text", "text": "x", "annotations": []}
    message = Message(id="msg_1", status="completed", role="assistant", content=[])
    assert "phase" not in json.loads(message.model_dump_json())
    reasoning = json.loads(Reasoning(id="rs_1", summary=[], status="completed").model_dump_json())
    assert reasoning == {"type": "reasoning", "id": "rs_1", "summary": [], "status": "completed"}
