"""The control path of a turn: cancel, interrupt and the end of a background run.

Control never goes through the delta queue: it works with the queue full and a reader
that has stopped reading, it takes effect before anything still queued, and generation
stops at once. A background run that cannot start releases whoever waits for it.
Every stream is checked by the stream checker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from app.backends.base import Delta, GenerationRequest
from app.backends.scripted import Script, ScriptedBackend, text_script
from app.engine.engine import Engine
from app.engine.history import History, HistorySource, NoHistory
from app.engine.models import ModelRouter
from app.engine.runs import LiveTurns
from app.engine.turn import Emitted, Turn, TurnPhase
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


async def _turn(backend: ScriptedBackend, model: str = "fast", store: SqlResponseStore | None = None,
                history: HistorySource | None = None, **body: Any) -> Turn:
    engine = Engine(ModelRouter([backend], model), store=store)
    return await engine.prepare({"model": model, "input": "x", **body}, tenant="t",
                                history=history or NoHistory())


def _decoded(emitted: list[Emitted]) -> list[dict[str, Any]]:
    return [json.loads(item.data) for item in emitted]


async def _read_until_first_delta(events: AsyncIterator[Emitted]) -> list[Emitted]:
    seen: list[Emitted] = []
    async for emitted in events:
        seen.append(emitted)
        if emitted.type == "response.output_text.delta":
            return seen
    raise AssertionError("the stream ended before any delta")


async def _until_queue_full(turn: Turn) -> None:
    """The pump fills the queue while nobody reads (a bounded number of loop steps)."""
    while turn._queue is None or not turn._queue.full():
        await asyncio.sleep(0)


async def _stopped_reader(turn: Turn, signal: Any) -> tuple[list[Emitted], list[Emitted]]:
    """Read up to the first delta, stop reading until the queue is full, send the signal,
    check generation stopped while nobody read, then read the rest. ``before`` is every
    event made before the signal (the reader's batch may hold more than it read), ``after``
    every event made after it."""
    events = turn.events()
    await _read_until_first_delta(events)
    await _until_queue_full(turn)
    made = len(turn.emitted)
    signal()  # must neither raise QueueFull nor block
    pump = turn._pump_task
    assert pump is not None
    await asyncio.wait({pump})  # generation stopped though the reader has not read again
    [emitted async for emitted in events]
    return turn.emitted[:made], turn.emitted[made:]


async def test_cancel_with_a_full_queue_and_a_stopped_reader() -> None:
    backend = _backend()
    turn = await _turn(backend)
    before, after = await _stopped_reader(turn, turn.cancel)
    assert len(backend.cancelled) == 1, "the backend stream was not closed"
    types = [emitted.type for emitted in after]
    assert "response.output_text.delta" not in types, "queued deltas were delivered after the cancel"
    assert types[-1] == "response.incomplete"
    final = check_stream(_decoded(before + after), expect_done=False)
    assert final["status"] == "cancelled"
    made = "".join(json.loads(emitted.data)["delta"] for emitted in before
                   if emitted.type == "response.output_text.delta")
    assert made and final["output"][0]["content"][0]["text"] == made
    assert turn.ended


async def test_interrupt_with_a_full_queue_and_a_stopped_reader() -> None:
    backend = _backend()
    turn = await _turn(backend)
    error = ServerError("The server is shutting down.", code="server_shutting_down")
    before, after = await _stopped_reader(turn, lambda: turn.interrupt(error))
    assert len(backend.cancelled) == 1
    assert [emitted.type for emitted in after] == ["error", "response.failed"]
    final = check_stream(_decoded(before + after), expect_done=False)
    assert final["status"] == "failed" and final["error"]["code"] == "server_shutting_down"


async def test_the_first_signal_wins_and_later_ones_are_harmless() -> None:
    backend = _backend()
    turn = await _turn(backend)

    def both() -> None:
        turn.interrupt(ServerError("Connection cap.", code="websocket_connection_limit_reached"))
        turn.cancel()
        turn.interrupt(ServerError("Shutdown.", code="server_shutting_down"))

    before, after = await _stopped_reader(turn, both)
    final = check_stream(_decoded(before + after), expect_done=False)
    assert final["error"]["code"] == "websocket_connection_limit_reached"
    turn.cancel()  # after the end: nothing happens
    assert turn.response.status == "failed"


async def test_cancel_wakes_a_reader_waiting_on_an_empty_queue() -> None:
    backend = _backend()
    turn = await _turn(backend, model="slow")
    events = turn.events()
    before = await _read_until_first_delta(events)
    reader = asyncio.ensure_future(events.__anext__())
    while turn._queue is None or turn._queue._getter is None:  # the reader waits in queue.get()
        await asyncio.sleep(0)
    turn.cancel()
    rest = [await reader] + [emitted async for emitted in events]
    assert len(backend.cancelled) == 1
    final = check_stream(_decoded(before + rest), expect_done=False)
    assert final["status"] == "cancelled"


async def test_a_turn_cancelled_before_it_runs_never_calls_the_backend() -> None:
    backend = _backend()
    turn = await _turn(backend)
    turn.cancel()
    final = check_stream(_decoded([emitted async for emitted in turn.events()]), expect_done=False)
    assert final["status"] == "cancelled"
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
        turn = await _turn(backend, "slow", store=store, history=_Fixed(), previous_response_id="resp_gone",
                           background=True)
        live = LiveTurns()
        live.start_background(turn)
        with pytest.raises(PreviousResponseNotFound):
            await turn.wait_started()
        await turn.wait_ended()
        assert [emitted async for emitted in turn.follow()] == []
        assert live.get("t", turn.id) is None
        assert backend.cancelled == backend.requests  # started at most once, and stopped
        assert await store.get("t", turn.id) is None
    finally:
        await store.close()


async def test_a_background_task_cancelled_before_it_ran_ends() -> None:
    backend = _backend()
    turn = await _turn(backend, background=True, store=None)
    live = LiveTurns()
    live.start_background(turn)
    for task in list(live._background):
        task.cancel()
    with pytest.raises(ServerError):
        await turn.wait_started()
    await turn.wait_ended()
    assert turn.phase is TurnPhase.ENDED


async def test_background_cancel_ends_and_is_recorded(tmp_path: Path) -> None:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "instance")
    await store.open()
    try:
        backend = _backend()
        turn = await _turn(backend, model="slow", store=store, background=True)
        live = LiveTurns()
        live.start_background(turn)
        await turn.wait_started()
        follower = turn.follow()
        seen = [await follower.__anext__()]
        while seen[-1].type != "response.output_text.delta":
            seen.append(await follower.__anext__())
        assert live.cancel("t", turn.id)
        await turn.wait_ended()
        stored = await store.get("t", turn.id)
        assert stored is not None and stored.status == "cancelled"
        seen += [emitted async for emitted in follower]
        assert check_stream(_decoded(seen), expect_done=False)["status"] == "cancelled"
        assert not live.cancel("t", turn.id)  # ended: nothing to cancel here any more
    finally:
        await store.close()


async def test_a_stream_whose_start_fails_fails_before_its_first_event(tmp_path: Path) -> None:
    # What the SSE transport does: open() before committing to a stream, so the failure
    # is a plain error (the chain vanished between prepare and begin).
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "i")
    await store.open()
    try:
        backend = _backend()
        turn = await _turn(backend, "slow", store=store, history=_Fixed(), previous_response_id="resp_gone",
                           stream=True)
        with pytest.raises(PreviousResponseNotFound):
            await turn.open()
        # the model started while the start was recorded is stopped before the error
        assert turn.emitted == [] and backend.cancelled == backend.requests
        assert await store.get("t", turn.id) is None
    finally:
        await store.close()


async def test_an_opened_turn_never_driven_is_discarded_as_its_client_leaving(tmp_path: Path) -> None:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "i")
    await store.open()
    try:
        backend = _backend()
        turn = await _turn(backend, "slow", store=store, stream=True)
        await turn.open()
        stored = await store.get("t", turn.id)
        assert stored is not None and stored.status == "in_progress"
        await turn.discard()
        await turn.discard()  # idempotent
        assert backend.cancelled == backend.requests  # the model it started is stopped
        stored = await store.get("t", turn.id)
        assert stored is not None and stored.status == "incomplete"
        assert stored.resource["incomplete_details"] == {"reason": "client_disconnected"}
        assert turn.phase is TurnPhase.ENDED
        check_stream(_decoded(turn.emitted), expect_done=False)
    finally:
        await store.close()


async def test_deltas_already_queued_leave_as_one_batch() -> None:
    """A burst (the scripted backend yields its deltas without waiting) becomes a few
    batches, not one per delta; every batch is non-empty, the start comes first, and the
    events flattened are one valid stream."""
    turn = await _turn(_backend())
    batches = [batch async for batch in turn.batches()]
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
        turn = await _turn(backend, "m", store=store)
        return [[emitted.type for emitted in batch] async for batch in turn.batches()]
    finally:
        if store is not None:
            await store.close()


@pytest.mark.parametrize("stored", [False, True])
async def test_the_start_leaves_first_with_what_the_model_already_made(tmp_path: Path, stored: bool) -> None:
    """The model's request leaves before the start is made (a stored stream's while the
    start is recorded): what it made by then joins the start's batch, one send."""
    batches = await _batches(text_script("a ", "b "), tmp_path, stored)
    assert batches[0][:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in batches[0]


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
    turn = await _turn(backend, model="slow")
    batches = [[emitted.type for emitted in batch] async for batch in turn.batches()]
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
        turn = await _turn(ScriptedBackend({"short": text_script("a", "b")}), "short", store=store, background=True)
        live = LiveTurns()
        live.start_background(turn)
        await turn.wait_started()
        seen: list[Emitted] = []

        async def follow() -> None:
            async for emitted in turn.follow():
                seen.append(emitted)

        follower = asyncio.create_task(follow())
        while not turn.finished:  # the terminal event is made; its write waits
            await asyncio.sleep(0.01)
        for _ in range(20):
            await asyncio.sleep(0)
        assert seen and all(emitted.type != "response.completed" for emitted in seen)
        assert turn.emitted[-1].type == "response.completed"
        release.set()
        await follower
        assert check_stream(_decoded(seen), expect_done=False)["status"] == "completed"
    finally:
        await store.close()


@pytest.mark.parametrize("background", [False, True], ids=["stream", "background"])
async def test_an_end_that_cannot_be_recorded_fails_the_response_and_is_written_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, background: bool
) -> None:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "i")
    await store.open()
    try:
        async def unreachable(*args: Any, **kwargs: Any) -> bool:  # injected: the database went away
            raise StoreUnavailable("The response store cannot be reached at the moment; retry shortly.")

        monkeypatch.setattr(store, "finish", unreachable)
        # a model slower than the wait for an answer at once, so the start is recorded
        # first and the end alone cannot be
        model = Script(text_script("a", "b"), delay=0.02)
        turn = await _turn(ScriptedBackend({"short": model}), "short", store=store,
                           background=background, stream=not background)
        if background:
            live = LiveTurns()
            live.start_background(turn)
            await turn.wait_started()
            events = [emitted async for emitted in turn.follow()]
        else:
            events = [emitted async for batch in turn.batches() for emitted in batch]
        decoded = _decoded(events)
        assert check_stream(decoded, expect_done=False)["status"] == "failed"
        assert [event["type"] for event in decoded][-2:] == ["error", "response.failed"]
        assert decoded[-1]["response"]["error"]["code"] == "store_unavailable"
        assert decoded[-1]["response"]["completed_at"] is None
        assert [part["text"] for part in decoded[-1]["response"]["output"][0]["content"]] == ["ab"]
        assert isinstance(turn.error, StoreUnavailable) and turn.emitted == events
        # the store, reachable again (the write path itself never failed here), is
        # given the end the client was told
        with anyio.fail_after(30):  # a bound, not a measurement
            while (stored := await store.get("t", turn.id)) is None or stored.status != "failed":
                await asyncio.sleep(0.05)
        assert stored.resource["error"]["code"] == "store_unavailable"
        assert await store.events("t", turn.id) == [emitted.data for emitted in events]
    finally:
        await store.close()
