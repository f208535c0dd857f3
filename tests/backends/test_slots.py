"""The slot pool of an embedded model, on its own (no model needed)."""

from __future__ import annotations

import asyncio

import pytest

from app.backends.slots import SlotPool
from app.errors import TooManyRequests

pytestmark = pytest.mark.anyio


async def test_free_places_are_taken_at_once_until_none_is_left() -> None:
    pool = SlotPool(3, queue=0)
    assert {await pool.acquire() for _ in range(3)} == {0, 1, 2}
    assert pool.busy == 3
    with pytest.raises(TooManyRequests):
        await pool.acquire()


async def test_waiters_are_served_first_come_first_served_and_the_queue_is_bounded() -> None:
    pool = SlotPool(1, queue=2)
    held = await pool.acquire()
    order: list[str] = []

    async def wait(name: str) -> None:
        slot = await pool.acquire()
        order.append(name)
        pool.release(slot)

    first = asyncio.create_task(wait("first"))
    await asyncio.sleep(0)
    second = asyncio.create_task(wait("second"))
    await asyncio.sleep(0)
    assert pool.waiting == 2
    with pytest.raises(TooManyRequests):
        pool.check()
    with pytest.raises(TooManyRequests):
        await pool.acquire()
    pool.release(held)
    await asyncio.gather(first, second)
    assert order == ["first", "second"] and pool.busy == 0 and pool.waiting == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_loses_no_slot() -> None:
    pool = SlotPool(1, queue=1)
    held = await pool.acquire()
    waiter = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert pool.waiting == 0
    pool.release(held)
    assert pool.busy == 0


async def test_a_slot_handed_to_a_waiter_cancelled_at_that_moment_is_passed_back() -> None:
    pool = SlotPool(1, queue=1)
    held = await pool.acquire()
    waiter = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0)
    pool.release(held)  # handed over...
    waiter.cancel()  # ...and cancelled before it ran
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert pool.busy == 0
    assert await pool.acquire() == 0


async def test_a_place_tried_for_is_taken_only_when_free_and_nobody_waits() -> None:
    pool = SlotPool(2, queue=2)
    assert pool.try_acquire() == 0
    held = await pool.acquire()
    assert pool.try_acquire() is None  # none free
    waiter = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0)
    pool.release(held)  # goes to the waiter, not to whoever tries
    assert await waiter == held and pool.try_acquire() is None
    pool.release(held)
    assert pool.try_acquire() == held
