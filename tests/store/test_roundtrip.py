"""What goes in comes out: a response's row, items, snapshot and events."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.errors import PreviousResponseNotFound
from app.store.base import StoreConflict
from app.store.sql import SqlResponseStore
from tests.store.helpers import (
    assistant_message,
    events_of,
    final,
    function_tool,
    new_id,
    new_response,
    resource,
    row_count,
    user_message,
)

pytestmark = pytest.mark.anyio

AWKWARD = {
    "zeta": 1,
    "alpha": [1.0, 2.5, -0.0, 1e-7, 12345678901234567890],
    "text": "naïve café — 漢字 😀 \u0000 \"quoted\" \\ back\nslash",
    "nested": {"b": None, "a": True, "empty": {}, "list": []},
}


async def test_begin_get_finish_round_trip(store: SqlResponseStore, tenant: str) -> None:
    tools = [function_tool("get_weather")]
    inputs = [user_message("What is the weather?"), {**user_message("again"), "extra": AWKWARD}]
    begun = new_response(tenant, inputs=inputs, tools=tools, background=True)
    await store.begin(begun)

    stored = await store.get(tenant, begun.id)
    assert stored is not None
    assert (stored.id, stored.tenant, stored.status, stored.model) == (begun.id, tenant, "in_progress", "test-model")
    assert stored.resource == begun.resource and stored.tools == tools and stored.background is True
    assert stored.previous_response_id is None and stored.instructions is None
    assert await store.events(tenant, begun.id) is None

    output = [assistant_message("Sunny."), {"type": "function_call", "id": new_id("fc"), "call_id": "call_1",
                                            "name": "get_weather", "arguments": '{"city": "Paris"}',
                                            "status": "completed"}]
    snapshot = final(begun, output) | {"metadata": {"k": "v"}, "extra": AWKWARD}
    events = [*events_of(begun.id, 5), '{"type":"response.completed","text":"漢字 😀"}']
    await store.finish(tenant, begun.id, snapshot, output, events)

    stored = await store.get(tenant, begun.id)
    assert stored is not None and stored.status == "completed"
    assert stored.resource == snapshot
    assert list(stored.resource) == list(snapshot)  # key order too
    assert await store.events(tenant, begun.id) == events
    links = await store.chain(tenant, begun.id)
    assert links is not None and len(links) == 1
    assert links[0].input_items == inputs and links[0].output_items == output and links[0].tools == tools
    assert list(links[0].input_items[1]["extra"]) == list(AWKWARD)


async def test_json_text_is_kept_exactly(store: SqlResponseStore, tenant: str) -> None:
    begun = new_response(tenant, inputs=[{"id": "odd", "type": "message", "payload": AWKWARD,
                                          "lone_surrogate": "\ud800x"}])
    await store.begin(begun)
    links = await store.chain(tenant, begun.id)
    assert links is not None
    item = links[0].input_items[0]
    assert item["payload"] == AWKWARD and item["lone_surrogate"] == "\ud800x"
    assert repr(item["payload"]["alpha"]) == repr(AWKWARD["alpha"])


async def test_large_event_stream_round_trips(store: SqlResponseStore, tenant: str) -> None:
    begun = new_response(tenant)
    await store.begin(begun)
    events = events_of(begun.id, 5000)
    await store.finish(tenant, begun.id, final(begun, []), [], events)
    assert await store.events(tenant, begun.id) == events


async def test_set_status_moves_a_queued_response(store: SqlResponseStore, tenant: str) -> None:
    begun = new_response(tenant, status="queued", background=True)
    await store.begin(begun)
    running = resource(begun.id, status="in_progress", background=True)
    await store.set_status(tenant, begun.id, "in_progress", running)
    stored = await store.get(tenant, begun.id)
    assert stored is not None and stored.status == "in_progress" and stored.resource == running
    with pytest.raises(ValueError):
        await store.set_status(tenant, begun.id, "completed", running)


async def test_finishing_twice_is_a_conflict(store: SqlResponseStore, tenant: str) -> None:
    begun = new_response(tenant)
    await store.begin(begun)
    await store.finish(tenant, begun.id, final(begun, []), [], events_of(begun.id))
    with pytest.raises(StoreConflict):
        await store.finish(tenant, begun.id, final(begun, []), [], events_of(begun.id))
    with pytest.raises(StoreConflict):
        await store.set_status(tenant, begun.id, "in_progress", begun.resource)
    with pytest.raises(StoreConflict):
        await store.finish(tenant, new_id("resp"), final(begun, []), [], [])
    with pytest.raises(ValueError):
        await store.finish(tenant, begun.id, begun.resource, [], [])


async def test_only_a_running_response_of_ones_own_is_finished(store: SqlResponseStore, tenant: str) -> None:
    """The end is written only while the response runs: another tenant's is never begun
    for this one; a deleted one's end writes nothing (and is no error)."""
    begun = new_response(tenant)
    await store.begin(begun)
    with pytest.raises(StoreConflict):
        await store.finish("someone-else", begun.id, final(begun, []), [], [])
    assert await store.delete(tenant, begun.id) is True
    assert await store.finish(tenant, begun.id, final(begun, [assistant_message("late")]),
                              [assistant_message("late")], events_of(begun.id)) is False
    assert await store.get(tenant, begun.id) is None
    assert await store.events(tenant, begun.id) is None
    other = new_response(tenant)
    await store.begin(other)
    assert await store.finish(tenant, other.id, final(other, []), [], events_of(other.id)) is True
    stored = await store.get(tenant, other.id)
    assert stored is not None and stored.status == "completed"


async def test_beginning_an_id_twice_is_a_conflict(store: SqlResponseStore, tenant: str) -> None:
    begun = new_response(tenant)
    await store.begin(begun)
    with pytest.raises(StoreConflict):
        await store.begin(new_response(tenant, response_id=begun.id))
    links = await store.chain(tenant, begun.id)
    assert links is not None and links[0].input_items == begun.input_items


async def test_continuing_an_absent_response_writes_nothing(store: SqlResponseStore, tenant: str) -> None:
    orphan = new_response(tenant, previous=new_id("resp"))
    with pytest.raises(PreviousResponseNotFound) as raised:
        await store.begin(orphan)
    assert raised.value.code == "previous_response_not_found"
    assert await store.get(tenant, orphan.id) is None


async def test_finish_after_cancel_leaves_it_cancelled(store: SqlResponseStore, tenant: str) -> None:
    begun = new_response(tenant, background=True)
    await store.begin(begun)
    cancelled = resource(begun.id, status="cancelled", background=True)
    await store.set_status(tenant, begun.id, "cancelled", cancelled)

    await store.finish(tenant, begun.id, final(begun, [assistant_message("late")]), [assistant_message("late")],
                       events_of(begun.id))
    stored = await store.get(tenant, begun.id)
    assert stored is not None and stored.status == "cancelled" and stored.resource == cancelled
    links = await store.chain(tenant, begun.id)
    assert links is not None and links[0].output_items == []
    assert await store.events(tenant, begun.id) is None
    await store.set_status(tenant, begun.id, "in_progress", begun.resource)  # still a no-op
    stored = await store.get(tenant, begun.id)
    assert stored is not None and stored.status == "cancelled"


async def test_a_cancel_recorded_by_finish_is_final(store: SqlResponseStore, tenant: str) -> None:
    begun = new_response(tenant, background=True)
    await store.begin(begun)
    partial = [assistant_message("partial")]
    cancelled = final(begun, partial, status="cancelled")
    await store.finish(tenant, begun.id, cancelled, partial, events_of(begun.id, 2))
    await store.finish(tenant, begun.id, final(begun, []), [], [])  # the run's own finish: dropped
    stored = await store.get(tenant, begun.id)
    assert stored is not None and stored.resource == cancelled
    assert await store.events(tenant, begun.id) == events_of(begun.id, 2)


async def test_finish_after_delete_writes_nothing(store: SqlResponseStore, tenant: str) -> None:
    begun = new_response(tenant)
    await store.begin(begun)
    assert await store.delete(tenant, begun.id)
    await store.finish(tenant, begun.id, final(begun, [assistant_message("x")]), [assistant_message("x")],
                       events_of(begun.id))
    assert await store.get(tenant, begun.id) is None
    assert await row_count(store, "items", begun.id) == 0



async def test_nul_in_the_clients_text_is_recorded(store: SqlResponseStore, tenant: str) -> None:
    """PostgreSQL's text columns cannot hold NUL; the response's JSON keeps it exactly."""
    item = {**user_message("a\x00b"), "id": "msg_\x00odd"}
    begun = replace(new_response(tenant, inputs=[item]), instructions="Be\x00brief.")
    begun = replace(begun, resource={**begun.resource, "instructions": "Be\x00brief."})
    await store.begin(begun)
    stored = await store.get(tenant, begun.id)
    assert stored is not None and stored.resource["instructions"] == "Be\x00brief."
    page = await store.input_items(tenant, begun.id, limit=10, order="asc", after=None)
    assert page is not None and page.data == [item]


async def test_a_response_recorded_without_events_keeps_none(store: SqlResponseStore, tenant: str) -> None:
    """A plain JSON answer keeps no events (``None``), recorded whole or finished."""
    output = [assistant_message("whole")]
    whole = new_response(tenant)
    assert await store.record(whole, final(whole, output), output, None)
    begun = new_response(tenant)
    await store.begin(begun)
    assert await store.finish(tenant, begun.id, final(begun, output), output, None)
    for response in (whole, begun):
        stored = await store.get(tenant, response.id)
        assert stored is not None and stored.status == "completed"
        assert await store.events(tenant, response.id) is None
        links = await store.chain(tenant, response.id)
        assert links is not None and links[0].output_items == output
