"""The state enums name exactly the strings the wire models accept."""

from typing import get_args

from app.protocol.items import FunctionCall, ItemParam, ItemStatus, OutputItem
from app.protocol.responses import ResponseResource, ResponseStatus
from app.protocol.states import ItemStatus as ItemStatusEnum
from app.protocol.states import ItemType
from app.protocol.states import ResponseStatus as ResponseStatusEnum


def test_response_status_enum_matches_the_wire_type():
    assert {m.value for m in ResponseStatusEnum} == set(get_args(ResponseStatus))


def test_item_status_enum_matches_the_wire_type():
    assert {m.value for m in ItemStatusEnum} == set(get_args(ItemStatus))


def test_final_statuses():
    assert {s for s in ResponseStatusEnum if s.final} == {"completed", "failed", "incomplete", "cancelled"}


def _types(union: object) -> set[str]:
    names: set[str] = set()
    for model in get_args(get_args(union)[0]) if get_args(union) else ():
        model = get_args(model)[0] if get_args(model) else model
        field = getattr(model, "model_fields", {}).get("type")
        if field is not None:
            names.update(a for a in get_args(field.annotation) if isinstance(a, str))
    return names


def test_item_types_are_the_item_kinds_the_wire_models_name():
    wire = _types(ItemParam) | _types(OutputItem)
    assert wire, "no item types found in the wire unions"
    assert wire - {"item_reference"} <= {t.value for t in ItemType}
    assert {t.value for t in ItemType} - {"item_reference"} <= wire


def test_a_member_serializes_as_its_string():
    item = FunctionCall(id="fc_1", call_id="c", name="f", arguments="{}", status=ItemStatusEnum.COMPLETED)
    assert item.model_dump_json().count('"status":"completed"') == 1
    response = ResponseResource.model_construct(status=ResponseStatusEnum.FAILED)
    assert response.status == "failed"
