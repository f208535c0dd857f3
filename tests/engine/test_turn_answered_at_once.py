"""While other responses are in flight (another turn of the same engine opened and not
ended), a stored stream whose model answers whole at once is recorded once, whole, before any of its events leaves,
and its events leave as one batch; one whose model takes longer, and any on an idle
server, has its start recorded first. Either way a write that fails before anything was
sent is a plain error from :meth:`Turn.open`. The store is the real SQL store; the
calls it gets are counted by wrapping its methods (the wrapped methods still run)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from app.backends.scripted import Script, ScriptedBackend, text_script
from app.engine.engine import Engine
from app.engine.history import History, HistorySource, NoHistory
from app.engine.models import ModelRouter
from app.engine.turn import ANSWERED_AT_ONCE_SECONDS, Turn, TurnPhase
from app.errors import PreviousResponseNotFound, StoreUnavailable
from app.store.sql import SqlResponseStore
from compliance import check_stream
from tests.engine.conftest import counted_writes

pytestmark = pytest.mark.anyio

SLOWER = ANSWERED_AT_ONCE_SECONDS * 20
"""Seconds a scripted model (named as such) waits before each delta: longer than the
wait for an answer at once, and than a start's write takes on a loaded machine (at four
times the wait, 20 ms, a write in a full run of the suite once took longer)."""


class _Fixed(HistorySource):
    """A chain that was loaded before the store changed under it."""

    async def load(self, response_id: str) -> History:
        return History()


async def _turn(store: SqlResponseStore, script: Script, history: HistorySource | None = None, *,
                busy: bool = True, **body: Any) -> tuple[Turn, ScriptedBackend]:
    """A stream's turn; ``busy``: another response of the same engine is in flight (a
    ``store: false`` one, opened, which writes nothing and never ends here)."""
    backend = ScriptedBackend({"m": script})
    engine = Engine(ModelRouter([backend], "m"), store=store)
    if busy:
        other = await engine.prepare({"model": "m", "input": "x", "stream": True, "store": False}, tenant="t",
                                     history=NoHistory())
        await other.open()
    turn = await engine.prepare({"model": "m", "input": "Hi there", "stream": True, **body}, tenant="t",
                                history=history or NoHistory())
    return turn, backend


async def test_a_stream_answered_at_once_is_recorded_whole_and_leaves_in_one_batch(
        store: SqlResponseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counted_writes(store, monkeypatch)
    turn, _ = await _turn(store, Script(text_script("Hello", " world")))
    await turn.open()  # as the SSE transport does, before it commits to a stream
    assert calls == ["record"]
    assert turn.phase is TurnPhase.ENDED  # recorded before anything is sent
    batches = [batch async for batch in turn.batches()]
    assert len(batches) == 1
    events = [json.loads(emitted.data) for emitted in batches[0]]
    final = check_stream(events, expect_done=False)
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "Hello world"
    assert calls == ["record"]
    stored = await store.get("t", turn.id)
    assert stored is not None and stored.status == "completed"
    assert stored.resource == final
    # kept for a replay, as a stream's events are
    assert await store.events("t", turn.id) == [emitted.data for emitted in batches[0]]
    page = await store.input_items("t", turn.id, limit=10, order="asc", after=None)
    assert page is not None and [item["content"][0]["text"] for item in page.data] == ["Hi there"]


async def test_a_stream_the_model_answers_slowly_has_its_start_recorded_first(
        store: SqlResponseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counted_writes(store, monkeypatch)
    turn, _ = await _turn(store, Script(text_script("a", "b"), delay=SLOWER))
    await turn.open()
    assert calls == ["begin"]
    stored = await store.get("t", turn.id)
    assert stored is not None and stored.status == "in_progress"
    batches = [[emitted.type for emitted in batch] async for batch in turn.batches()]
    assert batches[0] == ["response.created", "response.in_progress"]  # before any output
    assert calls == ["begin", "finish"]
    check_stream([json.loads(emitted.data) for emitted in turn.emitted], expect_done=False)


async def test_an_answer_at_once_whose_chain_vanished_is_a_plain_error(
        store: SqlResponseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chain was deleted between prepare and the write: the write of the whole
    response fails, and open() raises as a start that cannot be recorded does."""
    calls = counted_writes(store, monkeypatch)
    turn, _ = await _turn(store, Script(text_script("a")), history=_Fixed(), previous_response_id="resp_gone")
    with pytest.raises(PreviousResponseNotFound):
        await turn.open()
    assert calls == ["record"]
    assert await store.get("t", turn.id) is None
    assert turn.phase is TurnPhase.ENDED
    assert [batch async for batch in turn.batches()] == []  # nothing is ever sent


async def test_an_answer_at_once_the_store_cannot_take_is_a_plain_error(
        store: SqlResponseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    async def unreachable(*args: Any, **kwargs: Any) -> bool:  # injected: the database went away
        raise StoreUnavailable("The response store cannot be reached at the moment; retry shortly.")

    monkeypatch.setattr(store, "record", unreachable)
    turn, _ = await _turn(store, Script(text_script("a")))
    with pytest.raises(StoreUnavailable):
        await turn.open()
    assert await store.get("t", turn.id) is None


async def test_a_client_leaving_while_the_start_waits_for_the_model_stops_the_model(
        store: SqlResponseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counted_writes(store, monkeypatch)
    turn, backend = await _turn(store, Script(text_script("a", "b"), delay=SLOWER))
    opening = asyncio.create_task(turn.open())
    while not backend.requests:  # the model has been asked
        await asyncio.sleep(0)
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    assert backend.cancelled == backend.requests
    assert calls == [] and await store.get("t", turn.id) is None


async def test_a_background_stream_is_recorded_queued_first(
        store: SqlResponseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Queued is a state others may read at once: never held for the model."""
    calls = counted_writes(store, monkeypatch)
    turn, _ = await _turn(store, Script(text_script("a")), background=True)
    await turn.open()
    assert calls == ["begin"]
    stored = await store.get("t", turn.id)
    assert stored is not None and stored.status == "queued"
    await turn.run()
    assert calls[-1] == "finish"


async def test_on_an_idle_server_a_stream_answered_at_once_has_its_start_recorded_first(
        store: SqlResponseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing else runs: the start is written at once, while the model works, and the
    output leaves as soon as it comes, before the end's write."""
    calls = counted_writes(store, monkeypatch)
    turn, _ = await _turn(store, Script(text_script("a", "b")), busy=False)
    await turn.open()
    assert calls == ["begin"]
    batches = [[emitted.type for emitted in batch] async for batch in turn.batches()]
    assert len(batches) == 2 and "response.output_text.delta" in batches[0]
    assert batches[1][-1] == "response.completed"
    assert calls == ["begin", "finish"]


async def test_a_turn_counts_in_flight_from_its_opening_to_its_end(store: SqlResponseStore) -> None:
    backend = ScriptedBackend({"m": Script(text_script("a"))})
    engine = Engine(ModelRouter([backend], "m"), store=store)
    turns = [await engine.prepare({"model": "m", "input": "x", "stream": True}, tenant="t", history=NoHistory())
             for _ in range(2)]
    assert engine.in_flight.count == 0  # prepared only
    await turns[0].open()
    assert engine.in_flight.count == 1
    await turns[1].open()  # answered at once, recorded whole: already over
    assert engine.in_flight.count == 1
    async for _ in turns[0].batches():
        pass
    assert engine.in_flight.count == 0
    failing = await engine.prepare({"model": "m", "input": "x", "stream": True, "previous_response_id": "resp_gone"},
                                   tenant="t", history=_Fixed())
    with pytest.raises(PreviousResponseNotFound):
        await failing.open()
    assert engine.in_flight.count == 0  # a turn that never runs is not in flight
