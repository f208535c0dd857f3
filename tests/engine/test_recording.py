"""What a stored run writes (``app.engine.recording``), against the real SQL store on
SQLite: a start then an end, a start deferred to the end (one write), a step between
starts, and an end handed over to be written later. (When each is written, by delivery:
``test_run_recording``.)"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import weakref
from typing import Any

import pytest

from app.backends.base import Finish, TextDelta, Usage
from app.backends.scripted import Script, ScriptedBackend, text_script
from app.engine.builder import ResponseBuilder
from app.engine.delivery import Delivery
from app.engine.echo import initial_response
from app.engine.engine import Engine
from app.engine.models import ModelRouter
from app.engine.recording import Recording
from app.protocol.events import serialize_event
from app.protocol.responses import CreateResponseBody, ResponseResource
from app.store.sql import SqlResponseStore
from tests.engine.conftest import counted_writes, run_of

pytestmark = pytest.mark.anyio

INPUT = [{"type": "message", "id": "msg_in", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
TOOLS = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]


def _builder(response_id: str, status: str = "in_progress") -> ResponseBuilder:
    body = CreateResponseBody.model_validate({"model": "m", "input": "hi"})
    return ResponseBuilder(initial_response(body, response_id=response_id, model="m", status=status))


def _finish(builder: ResponseBuilder) -> list[str]:
    events = builder.start() + builder.feed(TextDelta("Hello")) + builder.feed(Finish("stop", Usage(3, 1)))
    return [serialize_event(event) for event in events]


def _recording(store: SqlResponseStore, response_id: str, remembered: list[list[Any]] | None = None) -> Recording:
    made: list[int] = []

    def input_items() -> list[dict[str, Any]]:
        made.append(1)
        return INPUT

    return Recording(store, tenant="t", response_id=response_id, tools=TOOLS, input_items=input_items,
                     on_recorded=None if remembered is None else remembered.append)


async def test_a_start_then_an_end(store: SqlResponseStore) -> None:
    builder = _builder("resp_a")
    remembered: list[list[Any]] = []
    recording = _recording(store, "resp_a", remembered)
    await recording.begin(builder.response)
    started = await store.get("t", "resp_a")
    assert started is not None and started.status == "in_progress" and started.tools == TOOLS
    assert recording.answer is None and not recording.end_written

    events = _finish(builder)
    await recording.end(builder.response, events)
    assert recording.end_written
    assert recording.answer is not None
    assert ResponseResource.model_validate_json(recording.answer) == builder.response
    ended = await store.get("t", "resp_a")
    assert ended is not None and ended.status == "completed"
    assert ended.resource == json.loads(recording.answer)
    assert await store.events("t", "resp_a") == events
    page = await store.input_items("t", "resp_a", limit=10, order="asc", after=None)
    assert page is not None and [item["id"] for item in page.data] == ["msg_in"]
    assert remembered == [[item.model_dump(mode="json") for item in builder.response.output]]


async def test_a_deferred_start_is_written_with_the_end_in_one_write(
    store: SqlResponseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = counted_writes(store, monkeypatch)
    builder = _builder("resp_b")
    recording = _recording(store, "resp_b")
    await recording.begin(builder.response, whole=True)  # deferred
    assert await store.get("t", "resp_b") is None  # nothing written yet
    _finish(builder)
    await recording.end(builder.response, None)  # a JSON answer keeps no events
    assert writes == ["record"]
    stored = await store.get("t", "resp_b")
    assert stored is not None and stored.status == "completed"
    assert await store.events("t", "resp_b") is None
    page = await store.input_items("t", "resp_b", limit=10, order="asc", after=None)
    assert page is not None and [item["id"] for item in page.data] == ["msg_in"]


async def test_a_step_between_starts_is_recorded(store: SqlResponseStore) -> None:
    builder = _builder("resp_c", status="queued")
    recording = _recording(store, "resp_c")
    await recording.begin(builder.response)
    builder.start()
    builder.begin()
    await recording.status(builder.response)
    stored = await store.get("t", "resp_c")
    assert stored is not None and stored.status == "in_progress" and stored.resource["status"] == "in_progress"


async def test_an_end_handed_over_is_written_later_and_a_whole_one_has_none(
    store: SqlResponseStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("app.store.late_ends.RETRY_SECONDS", 0.05)
    builder = _builder("resp_d")
    recording = _recording(store, "resp_d")
    await recording.begin(builder.response)
    _finish(builder)
    await recording.end_later(builder.response, None)
    for _ in range(100):  # the store's own retry writes it
        stored = await store.get("t", "resp_d")
        assert stored is not None
        if stored.status == "completed":
            break
        await asyncio.sleep(0.05)
    assert stored.status == "completed" and stored.resource["output"][0]["content"][0]["text"] == "Hello"

    whole = _builder("resp_e")
    deferred = _recording(store, "resp_e")
    await deferred.begin(whole.response, whole=True)
    _finish(whole)
    caplog.set_level(logging.INFO, logger="ors.store")
    await deferred.end_later(whole.response, None)  # no row to end: nothing is handed over
    await asyncio.sleep(0.2)
    assert await store.get("t", "resp_e") is None
    assert "resp_e" not in caplog.text  # the store was given no late end to try


@pytest.mark.parametrize(("delivery", "stored"), [
    (delivery, stored) for delivery in Delivery for stored in (True, False)
    if stored or delivery is not Delivery.BACKGROUND  # a background response is always stored
])
async def test_a_finished_run_is_freed_as_soon_as_it_is_let_go(
    store: SqlResponseStore, stored: bool, delivery: Delivery
) -> None:
    """No reference cycle through a run (its recording, event log and feed included): a
    finished run is freed by reference counting, not left to the cyclic collector, which
    ``ors serve`` runs rarely."""
    engine = Engine(ModelRouter([ScriptedBackend({"m": Script(text_script("Hello"))})], "m"), store=store)
    body = {"model": "m", "input": "Hi", "store": stored, "background": delivery is Delivery.BACKGROUND}
    run = await run_of(engine, body, delivery)
    if delivery is Delivery.BACKGROUND:
        await run.wait_ended()
        await asyncio.sleep(0)  # the driving task's own end
    else:
        [batch async for batch in run.batches()]
    assert ((await store.get("t", run.id)) is not None) == stored
    gone = weakref.ref(run)
    gc.disable()
    try:
        del run
        assert gone() is None
    finally:
        gc.enable()
