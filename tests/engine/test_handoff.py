"""The hand-over between a turn's pump and its consumer (``app.engine.handoff``), held
to asyncio's queue where a turn relies on it."""

from __future__ import annotations

import asyncio

import pytest

from app.engine.handoff import Handoff

pytestmark = pytest.mark.anyio


async def test_items_come_out_in_order_and_the_bounds_raise_as_asyncios_queue() -> None:
    handoff: Handoff[int] = Handoff(3)
    assert handoff.empty() and not handoff.full()
    for item in range(3):
        handoff.put_nowait(item)
    assert handoff.full() and handoff.qsize() == 3
    with pytest.raises(asyncio.QueueFull):
        handoff.put_nowait(3)
    assert [handoff.get_nowait() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(asyncio.QueueEmpty):
        handoff.get_nowait()


async def test_a_getter_waits_for_the_next_put() -> None:
    handoff: Handoff[str] = Handoff(2)
    got = asyncio.ensure_future(handoff.get())
    await asyncio.sleep(0.01)
    assert not got.done()
    handoff.put_nowait("delta")
    assert await asyncio.wait_for(got, 1) == "delta"


async def test_a_putter_waits_for_room_and_nothing_is_lost() -> None:
    handoff: Handoff[int] = Handoff(2)
    produced = list(range(50))

    async def pump() -> None:
        for item in produced:
            await handoff.put(item)

    task = asyncio.ensure_future(pump())
    await asyncio.sleep(0.01)
    assert handoff.full() and not task.done()  # blocked on a full hand-over
    consumed = [await handoff.get() for _ in produced]
    await asyncio.wait_for(task, 1)
    assert consumed == produced


async def test_a_cancelled_wait_leaves_the_next_one_working() -> None:
    handoff: Handoff[int] = Handoff(1)
    waiting = asyncio.ensure_future(handoff.get())
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    handoff.put_nowait(1)  # wakes nobody: the cancelled wait is gone
    assert await asyncio.wait_for(handoff.get(), 1) == 1
    handoff.put_nowait(2)
    blocked = asyncio.ensure_future(handoff.put(3))
    await asyncio.sleep(0.01)
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert handoff.get_nowait() == 2 and handoff.empty()  # the cancelled put put nothing
    await asyncio.wait_for(handoff.put(4), 1)
    assert handoff.get_nowait() == 4
