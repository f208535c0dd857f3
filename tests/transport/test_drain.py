"""``Drain``: streams are called back once when the server begins to drain."""

from __future__ import annotations

import asyncio

import pytest

from app.transport.drain import Drain

pytestmark = pytest.mark.anyio


async def test_each_registered_stream_is_called_back_once_when_the_drain_begins() -> None:
    drain = Drain()
    drain.bind()
    calls: list[str] = []
    drain.when_draining(lambda: calls.append("a"))
    forget_b = drain.when_draining(lambda: calls.append("b"))
    drain.when_draining(lambda: calls.append("c"))
    forget_b()  # this stream ended before the drain
    drain.begin()
    await asyncio.sleep(0)
    await asyncio.wait_for(drain.wait(), 1)
    assert sorted(calls) == ["a", "c"]
    await asyncio.sleep(0)
    assert sorted(calls) == ["a", "c"]  # once


async def test_a_stream_that_registers_after_the_drain_began_is_called_back_soon() -> None:
    drain = Drain()
    drain.bind()
    drain.begin()
    await drain.wait()
    calls: list[str] = []
    drain.when_draining(lambda: calls.append("late"))
    await asyncio.sleep(0)
    assert calls == ["late"]


async def test_a_failing_callback_does_not_keep_the_others_from_being_called() -> None:
    drain = Drain()
    drain.bind()
    calls: list[str] = []

    def broken() -> None:
        raise RuntimeError("boom")

    drain.when_draining(broken)
    drain.when_draining(lambda: calls.append("ok"))
    drain.begin()
    await drain.wait()
    assert calls == ["ok"]


async def test_the_drain_is_over_once_every_hold_is_released() -> None:
    """What lets uvicorn shut connections down: only once each connection holding the
    drain has closed itself."""
    drain = Drain()
    drain.bind()
    over = asyncio.Event()
    first, second = drain.hold(), drain.hold()
    drain.begin(then=over.set)
    await drain.wait()
    first()
    first()  # a release counts once
    await asyncio.sleep(0)
    assert not over.is_set()
    second()
    await asyncio.wait_for(over.wait(), 10)


async def test_a_drain_without_holds_is_over_as_it_begins() -> None:
    drain = Drain()
    drain.bind()
    over = asyncio.Event()
    drain.begin(then=over.set)
    await asyncio.wait_for(over.wait(), 10)


def test_a_drain_of_a_server_that_does_not_run_is_over_at_once() -> None:
    calls: list[str] = []
    Drain().begin(then=lambda: calls.append("over"))
    assert calls == ["over"]
