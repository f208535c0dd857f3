"""What a run serializes: each snapshot of the response once, however many events and
records carry it, and every event's JSON exactly as its model would write it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.backends.scripted import ScriptedBackend, text_script
from app.engine.delivery import Delivery
from app.engine.engine import Engine
from app.engine.models import ModelRouter
from app.protocol.events import RESPONSE_EVENTS, StreamEvent
from app.protocol.responses import ResponseResource
from app.store.engines import sqlite_url
from app.store.sql import SqlResponseStore
from compliance import check_stream
from tests.engine.conftest import run_of

pytestmark = pytest.mark.anyio

TOOLS = [{"type": "function", "name": f"tool_{i}", "description": "Does a thing.",
          "parameters": {"type": "object", "properties": {"p": {"type": "string"}}}} for i in range(5)]
EVENTS = {cls.model_fields["type"].default: cls for cls in RESPONSE_EVENTS}


@pytest.fixture
def dumps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every serialization of a response, as made."""
    made: list[str] = []
    original = ResponseResource.model_dump_json
    original_dict = ResponseResource.model_dump

    def counting(self: ResponseResource, **kwargs: Any) -> str:
        text = original(self, **kwargs)
        made.append(text)
        return text

    def counting_dict(self: ResponseResource, **kwargs: Any) -> Any:
        made.append(json.dumps(original_dict(self, **kwargs)))
        return original_dict(self, **kwargs)

    monkeypatch.setattr(ResponseResource, "model_dump_json", counting)
    monkeypatch.setattr(ResponseResource, "model_dump", counting_dict)
    return made


@pytest.mark.parametrize("store", [True, False])
async def test_each_snapshot_is_serialized_once(tmp_path: Path, dumps: list[str], store: bool) -> None:
    database = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "instance") if store else None
    if database is not None:
        await database.open()
    try:
        engine = Engine(ModelRouter([ScriptedBackend({"m": text_script("Hello", ", ", "world")})], "m"),
                        store=database)
        run = await run_of(engine, {"model": "m", "input": "x", "tools": TOOLS, "instructions": "Be brief.",
                                    "store": store}, Delivery.SSE)
        emitted = [event async for batch in run.batches() for event in batch]
    finally:
        if database is not None:
            await database.close()
    check_stream([json.loads(event.data) for event in emitted], expect_done=False)
    carrying = [event for event in emitted if event.type in EVENTS]
    assert [event.type for event in carrying] == ["response.created", "response.in_progress", "response.completed"]
    # the start's snapshot once (its record when stored, created and in_progress), the
    # end's once (the terminal event, and the record and answer when stored)
    assert len(dumps) == 2
    assert (run.answer is not None) == store
    if run.answer is not None:
        assert run.answer == dumps[1]
    for event in emitted:  # byte for byte what the event's model writes
        data = json.loads(event.data)
        model: type[StreamEvent] = EVENTS.get(event.type, StreamEvent)
        if model is not StreamEvent:
            rebuilt = model(sequence_number=data["sequence_number"],
                            response=ResponseResource.model_validate(data["response"]))  # type: ignore[call-arg]
            assert rebuilt.model_dump_json() == event.data


async def test_a_background_run_serializes_each_of_its_three_snapshots_once(
    tmp_path: Path, dumps: list[str]
) -> None:
    database = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "instance")
    await database.open()
    try:
        engine = Engine(ModelRouter([ScriptedBackend({"m": text_script("Hello")})], "m"), store=database)
        run = await run_of(engine, {"model": "m", "input": "x", "tools": TOOLS, "background": True})
        await run.wait_ended()
        emitted = [event async for event in run.follow()]
        stored = await database.get("t", run.id)
    finally:
        await database.close()
    check_stream([json.loads(event.data) for event in emitted], expect_done=False)
    assert [event.type for event in emitted if event.type in EVENTS] == [
        "response.created", "response.queued", "response.in_progress", "response.completed"]
    assert len(dumps) == 3  # queued (record, created, queued), in_progress (record, event), the end
    assert stored is not None and stored.status == "completed"


@pytest.mark.parametrize("store", [True, False])
async def test_input_items_take_their_stored_form_only_when_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   store: bool) -> None:
    """An answer that is not stored never needs its input items' stored form (an agent
    sends a hundred or more); a stored one makes it once, and keeps the ids it gave."""
    import app.engine.engine as engine_module

    made: list[object] = []
    original = engine_module.stored_form

    def counting(item: object) -> dict[str, Any]:
        made.append(item)
        return original(item)

    monkeypatch.setattr(engine_module, "stored_form", counting)
    database = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "instance") if store else None
    if database is not None:
        await database.open()
    try:
        engine = Engine(ModelRouter([ScriptedBackend({"m": text_script("Hi")})], "m"), store=database)
        conversation = [{"role": "user", "content": f"message {i}"} for i in range(3)]
        run = await run_of(engine, {"model": "m", "input": conversation, "store": store})
        await run.final()
        assert len(made) == (3 if store else 0)
        items = run.input_items
        assert run.input_items is items and len(made) == 3 and len(items) == 3
        if database is not None:
            page = await database.input_items("t", run.id, limit=10, order="asc", after=None)
            assert page is not None and [item["id"] for item in page.data] == [item["id"] for item in items]
    finally:
        if database is not None:
            await database.close()
