"""The control path of a run: cancel, interrupt and the end of a background run.

Control never goes through the delta queue: it works with the queue full and a reader
that has stopped reading, it takes effect before anything still queued, and generation
stops at once. A background run that cannot start releases whoever waits for it.
Every stream is checked by the stream checker."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from app.backends.base import Delta, GenerationRequest
from app.backends.scripted import Script, ScriptedBackend, text_script
from app.engine.delivery import Delivery
from app.engine.engine import Engine
from app.engine.event_log import Emitted
from app.engine.history import History, HistorySource, NoHistory
from app.engine.models import ModelRouter
from app.engine.run import Run, RunPhase
from app.errors import PreviousResponseNotFound, ServerError, StoreUnavailable
from app.store.engines import sqlite_url
from app.store.sql import SqlResponseStore
from compliance import check_stream

pytestmark = pytest.mark.anyio

MANY = 2000
"""Far more deltas than the queue holds (256)."""


class _Fixed(HistorySource):
    """A chain that was loaded before the store changed under it."""

    async def load(self, response_id: str) -> History:
        return History()


def _backend() -> ScriptedBackend:
    return ScriptedBackend(
        {
            "fast": text_script(*["tok "] * MANY),
            "slow": Script(text_script(*["tick "] * 400), delay=0.05),
        }
    )


def _engine(backend: ScriptedBackend, model: str, store: SqlResponseStore | None = None) -> Engine:
    return Engine(ModelRouter([backend], model), store=store)


async def _run(backend: ScriptedBackend, model: str = "fast", store: SqlResponseStore | None = None,
               history: HistorySource | None = None, delivery: Delivery = Delivery.SSE, **body: Any) -> Run:
    engine = _engine(backend, model, store)
    prepared = await engine.prepare({"model": model, "input": "x", **body}, tenant="t",
                                    history=history or NoHistory())
    return await engine.run(prepared, delivery)


def _decoded(emitted: list[Emitted]) -> list[dict[str, Any]]:
    return [json.loads(item.data) for item in emitted]


async def _read_until_first_delta(events: AsyncIterator[Emitted]) -> list[Emitted]:
    seen: list[Emitted] = []
    async for emitted in events:
        seen.append(emitted)
        if emitted.type == "response.output_text.delta":
            return seen
    raise AssertionError("the stream ended before any delta")


async def _events(run: Run) -> AsyncIterator[Emitted]:
    async with contextlib.aclosing(run.batches()) as batches:
        async for batch in batches:
            for emitted in batch:
                yield emitted


async def _until_queue_full(run: Run) -> None:
    """The pump fills the queue while nobody reads (a bounded number of loop steps)."""
    while not run._feed._queue.full():
        await asyncio.sleep(0)


class _Recorded:
    """Every event a run makes, as it makes it (the run's own log keeps a stored run's only)."""

    def __init__(self, run: Run) -> None:
        self.events: list[Emitted] = []
        emit = run._emit

        def recording(events: list[Any]) -> list[Emitted]:
            made = emit(events)
            self.events += made
            return made

        run._emit = recording  # type: ignore[method-assign]


async def _stopped_reader(run: Run, signal: Any) -> tuple[list[Emitted], list[Emitted]]:
    """Read up to the first delta, stop reading until the queue is full, send the signal,
    check generation stopped while nobody read, then read the rest. ``before`` is every
    event made before the signal (the reader's batch may hold more than it read), ``after``
    every event made after it."""
    recorded = _Recorded(run)
    events = _events(run)
    await _read_until_first_delta(events)
    await _until_queue_full(run)
    made = len(recorded.events)
    signal()  # must neither raise QueueFull nor block
    pump = run._feed._pump
    assert pump is not None
    await asyncio.wait({pump})  # generation stopped though the reader has not read again
    [emitted async for emitted in events]
    return recorded.events[:made], recorded.events[made:]


async def test_cancel_with_a_full_queue_and_a_stopped_reader() -> None:
    backend = _backend()
    run = await _run(backend)
    before, after = await _stopped_reader(run, run.cancel)
    assert len(backend.cancelled) == 1, "the backend stream was not closed"
    types = [emitted.type for emitted in after]
    assert "response.output_text.delta" not in types, "queued deltas were delivered after the cancel"
    assert types[-1] == "response.incomplete"
    final = check_stream(_decoded(before + after), expect_done=False)
    assert final["status"] == "cancelled"
    made = "".join(json.loads(emitted.data)["delta"] for emitted in before
                   if emitted.type == "response.output_text.delta")
    assert made and final["output"][0]["content"][0]["text"] == made
    assert run.ended


async def test_interrupt_with_a_full_queue_and_a_stopped_reader() -> None:
    backend = _backend()
    run = await _run(backend)
    error = ServerError("The server is shutting down.", code="server_shutting_down")
    before, after = await _stopped_reader(run, lambda: run.interrupt(error))
    assert len(backend.cancelled) == 1
    assert [emitted.type for emitted in after] == ["error", "response.failed"]
    final = check_stream(_decoded(before + after), expect_done=False)
    assert final["status"] == "failed" and final["error"]["code"] == "server_shutting_down"


async def test_the_first_signal_wins_and_later_ones_are_harmless() -> None:
    backend = _backend()
    run = await _run(backend)

    def both() -> None:
        run.interrupt(ServerError("Connection cap.", code="websocket_connection_limit_reached"))
        run.cancel()
        run.interrupt(ServerError("Shutdown.", code="server_shutting_down"))

    before, after = await _stopped_reader(run, both)
    final = check_stream(_decoded(before + after), expect_done=False)
    assert final["error"]["code"] == "websocket_connection_limit_reached"
    run.cancel()  # after the end: nothing happens
    assert run.response.status == "failed"


async def test_cancel_wakes_a_reader_waiting_on_an_empty_queue() -> None:
    """Once the pump is cancelled nothing more is ever queued: a reader blocked on the
    empty queue would wait for ever if the signal did not wake it."""
    backend = _backend()
    run = await _run(backend, model="slow")
    batches = run.batches()
    seen: list[Emitted] = []
    while not any(emitted.type == "response.output_text.delta" for emitted in seen):
        seen += await batches.__anext__()
    reader = asyncio.ensure_future(batches.__anext__())
    await asyncio.sleep(0)  # the reader's one step: it blocks on the empty queue (the next tick is 50 ms away)
    assert not reader.done() and run._feed.idle()
    run.cancel()
    with anyio.fail_after(10):  # a bound, not a measurement
        rest = await reader
        rest += [emitted async for batch in batches for emitted in batch]
    assert len(backend.cancelled) == 1
    final = check_stream(_decoded(seen + rest), expect_done=False)
    assert final["status"] == "cancelled"


async def test_a_run_cancelled_before_it_is_read_never_calls_the_backend() -> None:
    backend = _backend()
    run = await _run(backend, delivery=Delivery.JSON)  # a JSON run starts when it is read
    run.cancel()
    assert (await run.final()).status == "cancelled"
    assert backend.requests == []


async def test_a_background_run_that_cannot_start_ends(tmp_path: Path) -> None:
    """The response it continues was deleted between the check and the start: its start
    fails, and the waiters are released with that error instead of waiting forever. The
    model, started while the start was being recorded, is stopped before that: its stream
    is closed, nothing it made is sent."""
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "instance")
    await store.open()
    try:
        backend = _backend()
        engine = _engine(backend, "slow", store)
        prepared = await engine.prepare({"model": "slow", "input": "x", "previous_response_id": "resp_gone",
                                         "background": True}, tenant="t", history=_Fixed())
        ended: list[bool] = []

        async def on_end() -> None:
            ended.append(True)

        with pytest.raises(PreviousResponseNotFound):
            await engine.run(prepared, Delivery.BACKGROUND, on_end=on_end)
        assert ended == [True]
        assert engine.live.get("t", prepared.initial.id) is None
        assert backend.cancelled == backend.requests  # started at most once, and stopped
        assert await store.get("t", prepared.initial.id) is None
    finally:
        await store.close()


async def test_a_background_task_cancelled_before_it_ran_ends() -> None:
    backend = _backend()
    engine = _engine(backend, "fast")
    prepared = await engine.prepare({"model": "fast", "input": "x", "background": True}, tenant="t",
                                    history=NoHistory())
    run = Run(prepared, Delivery.BACKGROUND, metrics=engine.metrics, live=engine.live)
    engine.live.start_background(run)
    for task in list(engine.live._background):
        task.cancel()
    with pytest.raises(ServerError):
        await run.wait_started()
    await run.wait_ended()
    assert run.phase is RunPhase.ENDED
    assert [emitted async for emitted in run.follow()] == []


async def test_background_cancel_ends_and_is_recorded(tmp_path: Path) -> None:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "instance")
    await store.open()
    try:
        backend = _backend()
        engine = _engine(backend, "slow", store)
        run = await engine.run(await engine.prepare({"model": "slow", "input": "x", "background": True},
                                                    tenant="t", history=NoHistory()), Delivery.BACKGROUND)
        follower = run.follow()
        seen = [await follower.__anext__()]
        while seen[-1].type != "response.output_text.delta":
            seen.append(await follower.__anext__())
        assert engine.live.cancel("t", run.id)
        await run.wait_ended()
        stored = await store.get("t", run.id)
        assert stored is not None and stored.status == "cancelled"
        seen += [emitted async for emitted in follower]
        assert check_stream(_decoded(seen), expect_done=False)["status"] == "cancelled"
        assert not engine.live.cancel("t", run.id)  # ended: nothing to cancel here any more
    finally:
        await store.close()


async def test_a_stream_whose_start_fails_fails_before_its_first_event(tmp_path: Path) -> None:
    # The engine starts a stream's run before the transport commits to it, so the
    # failure is a plain error (the chain vanished between prepare and the start).
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "i")
    await store.open()
    try:
        backend = _backend()
        engine = _engine(backend, "slow", store)
        prepared = await engine.prepare({"model": "slow", "input": "x", "previous_response_id": "resp_gone",
                                         "stream": True}, tenant="t", history=_Fixed())
        with pytest.raises(PreviousResponseNotFound):
            await engine.run(prepared, Delivery.SSE)
        # the model started while the start was recorded is stopped before the error
        assert backend.cancelled == backend.requests
        assert await store.get("t", prepared.initial.id) is None
    finally:
        await store.close()


async def test_a_started_run_never_read_is_closed_as_its_client_leaving(tmp_path: Path) -> None:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "i")
    await store.open()
    try:
        backend = _backend()
        run = await _run(backend, "slow", store=store, stream=True)
        stored = await store.get("t", run.id)
        assert stored is not None and stored.status == "in_progress"
        await run.aclose()
        await run.aclose()  # idempotent
        assert backend.cancelled == backend.requests  # the model it started is stopped
        stored = await store.get("t", run.id)
        assert stored is not None and stored.status == "incomplete"
        assert stored.resource["incomplete_details"] == {"reason": "client_disconnected"}
        assert run.phase is RunPhase.ENDED
        check_stream(_decoded(run.log.events), expect_done=False)
    finally:
        await store.close()


async def test_deltas_already_queued_leave_as_one_batch() -> None:
    """A burst (the scripted backend yields its deltas without waiting) becomes a few
    batches, not one per delta; every batch is non-empty, the start comes first, and the
    events flattened are one valid stream."""
    run = await _run(_backend())
    batches = [batch async for batch in run.batches()]
    assert all(batches)
    assert [emitted.type for emitted in batches[0]][:2] == ["response.created", "response.in_progress"]
    deltas = sum(emitted.type == "response.output_text.delta" for batch in batches for emitted in batch)
    assert deltas == MANY
    assert len(batches) < MANY // 10
    final = check_stream(_decoded([emitted for batch in batches for emitted in batch]), expect_done=False)
    assert final["output"][0]["content"][0]["text"] == "tok " * MANY


async def _think(request: GenerationRequest) -> list[Delta]:
    """A scripted model (named as such) that thinks 20 ms, then answers at once."""
    await asyncio.sleep(0.02)
    return text_script("a ", "b ")


async def _batches(model: Script | list[Delta], tmp_path: Path, stored: bool) -> list[list[str]]:
    backend = ScriptedBackend({"m": model})
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "instance") if stored else None
    if store is not None:
        await store.open()
    try:
        run = await _run(backend, "m", store=store)
        return [[emitted.type for emitted in batch] async for batch in run.batches()]
    finally:
        if store is not None:
            await store.close()


async def test_what_the_model_made_while_the_start_was_recorded_joins_the_start(tmp_path: Path) -> None:
    """The model starts before the start is recorded: what it made meanwhile leaves
    with the start, in one send."""
    batches = await _batches(text_script("a ", "b "), tmp_path, stored=True)
    assert batches[0][:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in batches[0]


async def test_an_unstored_start_leaves_at_once(tmp_path: Path) -> None:
    """Nothing to record: the start is handed out before the model's first step."""
    batches = await _batches(text_script("a ", "b "), tmp_path, stored=False)
    assert batches[0] == ["response.created", "response.in_progress"]


@pytest.mark.parametrize("stored", [False, True])
async def test_the_deltas_that_come_with_the_end_wait_for_it_only_when_nothing_is_written(
        tmp_path: Path, stored: bool) -> None:
    """A model that answers at once after a pause: unstored, its deltas leave with the
    end (one send); stored, they leave before the end's durable write, the end after it."""
    batches = await _batches(Script(_think), tmp_path, stored)
    assert batches[0] == ["response.created", "response.in_progress"]
    with_deltas = [index for index, batch in enumerate(batches) if "response.output_text.delta" in batch]
    ends = [index for index, batch in enumerate(batches) if "response.completed" in batch]
    if stored:
        assert (with_deltas, ends) == ([1], [2])
    else:
        assert (with_deltas, ends) == ([1], [1])


async def test_a_slow_backend_is_never_waited_for() -> None:
    """Deltas that come one at a time leave one at a time: nothing is held back."""
    backend = ScriptedBackend({"slow": Script(text_script("a ", "b ", "c "), delay=0.05)})
    run = await _run(backend, model="slow")
    batches = [[emitted.type for emitted in batch] async for batch in run.batches()]
    with_deltas = [batch for batch in batches if "response.output_text.delta" in batch]
    assert [batch.count("response.output_text.delta") for batch in with_deltas] == [1, 1, 1]


async def test_a_follower_gets_the_terminal_event_once_the_end_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "i")
    await store.open()
    try:
        release = asyncio.Event()
        finish = store.finish

        async def held_finish(*args: Any, **kwargs: Any) -> bool:  # the end's write, held
            await release.wait()
            return await finish(*args, **kwargs)

        monkeypatch.setattr(store, "finish", held_finish)
        run = await _run(ScriptedBackend({"short": text_script("a", "b")}), "short", store=store,
                         delivery=Delivery.BACKGROUND, background=True)
        seen: list[Emitted] = []

        async def follow() -> None:
            async for emitted in run.follow():
                seen.append(emitted)

        follower = asyncio.create_task(follow())
        while not run.finished:  # the terminal event is made; its write waits
            await asyncio.sleep(0.01)
        for _ in range(20):
            await asyncio.sleep(0)
        assert seen and all(emitted.type != "response.completed" for emitted in seen)
        assert run.log.events[-1].type == "response.completed"
        release.set()
        await follower
        assert check_stream(_decoded(seen), expect_done=False)["status"] == "completed"
    finally:
        await store.close()


@pytest.mark.parametrize("delivery", [Delivery.SSE, Delivery.BACKGROUND], ids=["stream", "background"])
async def test_an_end_that_cannot_be_recorded_fails_the_response_and_is_written_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delivery: Delivery
) -> None:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "i")
    await store.open()
    try:
        async def unreachable(*args: Any, **kwargs: Any) -> bool:  # injected: the database went away
            raise StoreUnavailable("The response store cannot be reached at the moment; retry shortly.")

        monkeypatch.setattr(store, "finish", unreachable)
        background = delivery is Delivery.BACKGROUND
        run = await _run(ScriptedBackend({"short": text_script("a", "b")}), "short", store=store,
                         delivery=delivery, background=background)
        if background:
            events = [emitted async for emitted in run.follow()]
        else:
            events = [emitted async for batch in run.batches() for emitted in batch]
        decoded = _decoded(events)
        assert check_stream(decoded, expect_done=False)["status"] == "failed"
        assert [event["type"] for event in decoded][-2:] == ["error", "response.failed"]
        assert decoded[-1]["response"]["error"]["code"] == "store_unavailable"
        assert decoded[-1]["response"]["completed_at"] is None
        assert [part["text"] for part in decoded[-1]["response"]["output"][0]["content"]] == ["ab"]
        assert isinstance(run.error, StoreUnavailable) and run.log.events == events
        # the store, reachable again (the write path itself never failed here), is
        # given the end the client was told
        with anyio.fail_after(30):  # a bound, not a measurement
            while (stored := await store.get("t", run.id)) is None or stored.status != "failed":
                await asyncio.sleep(0.05)
        assert stored.resource["error"]["code"] == "store_unavailable"
        assert await store.events("t", run.id) == [emitted.data for emitted in events]
    finally:
        await store.close()
