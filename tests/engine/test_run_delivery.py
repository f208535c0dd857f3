"""What a run decides from its delivery: the events it makes, how the backend is asked,
when it is recorded (against the real SQL store on SQLite), and that ``on_end`` is
awaited exactly once however it ends."""

from __future__ import annotations

import contextlib
import json

import pytest

from app.backends.scripted import Script, ScriptedBackend, text_script
from app.engine.delivery import Delivery
from app.engine.engine import Engine
from app.engine.history import NoHistory
from app.engine.models import ModelRouter
from app.engine.run import Run
from app.errors import ServerError
from app.store.sql import SqlResponseStore
from tests.engine.conftest import counted_writes, run_of

pytestmark = pytest.mark.anyio


def _engine(store: SqlResponseStore | None = None) -> tuple[Engine, ScriptedBackend]:
    backend = ScriptedBackend({"m": text_script("Hello", " there"),
                               "slow": Script(text_script(*["tick "] * 400), delay=0.05)})
    return Engine(ModelRouter([backend], "m"), store=store), backend


@pytest.mark.parametrize("delivery", [Delivery.JSON, Delivery.SSE, Delivery.WEBSOCKET])
async def test_each_delivery_is_recorded_as_it_says(store: SqlResponseStore, monkeypatch: pytest.MonkeyPatch,
                                                   delivery: Delivery) -> None:
    engine, backend = _engine(store)
    writes = counted_writes(store, monkeypatch)
    run = await run_of(engine, {"model": "m", "input": "hi"}, delivery)
    assert writes == ([] if delivery is Delivery.JSON else ["begin"])  # a stream's start, before it is read
    batches = [batch async for batch in run.batches()]
    if delivery is Delivery.JSON:
        assert batches == [] and writes == ["record"]  # no events; recorded once, whole
        assert await store.events("t", run.id) is None
        assert backend.requests[0].incremental is False  # nobody sees it before its end
    else:
        assert writes == ["begin", "finish"]
        assert await store.events("t", run.id) == [emitted.data for batch in batches for emitted in batch]
        assert backend.requests[0].incremental is True
    stored = await store.get("t", run.id)
    assert stored is not None and stored.status == "completed"
    assert run.answer is not None and json.loads(run.answer) == stored.resource


@pytest.mark.parametrize(("delivery", "end"), [(Delivery.SSE, ["error", "response.failed"]),
                                               (Delivery.WEBSOCKET, ["response.failed"])])
async def test_only_a_websocket_run_leaves_out_the_error_event(delivery: Delivery, end: list[str]) -> None:
    engine, _ = _engine()
    run = await run_of(engine, {"model": "slow", "input": "hi"}, delivery)
    error = ServerError("The server is shutting down.", code="server_shutting_down")
    run.interrupt(error)
    types = [emitted.type async for batch in run.batches() for emitted in batch]
    assert types[-len(end):] == end and run.error is error


async def test_a_delivery_that_does_not_match_the_request_is_refused() -> None:
    engine, _ = _engine()
    prepared = await engine.prepare({"model": "m", "input": "hi"}, tenant="t", history=NoHistory())
    with pytest.raises(ValueError):
        await engine.run(prepared, Delivery.BACKGROUND)


async def _read_to_the_end(run: Run) -> None:
    [batch async for batch in run.batches()]


async def _leave_after_the_start(run: Run) -> None:
    async with contextlib.aclosing(run.batches()) as batches:
        await batches.__anext__()


async def _never_read(run: Run) -> None:
    await run.aclose()


@pytest.mark.parametrize("ending", [_read_to_the_end, _leave_after_the_start, _never_read])
async def test_on_end_is_awaited_once_however_the_run_ends(store: SqlResponseStore, ending: object) -> None:
    engine, _ = _engine(store)
    ends: list[str] = []

    async def on_end() -> None:
        ends.append("end")

    run = await run_of(engine, {"model": "slow" if ending is not _read_to_the_end else "m", "input": "hi"},
                       Delivery.SSE, on_end=on_end)
    await ending(run)  # type: ignore[operator]
    await run.aclose()  # after any end: nothing more
    assert ends == ["end"] and run.ended
    stored = await store.get("t", run.id)
    assert stored is not None and stored.status == ("completed" if ending is _read_to_the_end else "incomplete")
