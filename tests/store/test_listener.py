"""A ``LISTEN`` connection of its own on the real PostgreSQL server: lost, it comes back,
listens again, and asks for what it missed from the time of the first loss, until it can."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from app.errors import StoreUnavailable
from app.store.listener import Listener

pytestmark = pytest.mark.anyio


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _notify(dsn: str, channel: str, payload: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("SELECT pg_notify($1, $2)", channel, payload)
    finally:
        await connection.close()


async def test_lost_it_listens_again_and_asks_for_what_it_missed_until_the_store_answers(
    postgres_database_url: str,
) -> None:
    dsn = _dsn(postgres_database_url)
    heard: asyncio.Queue[str] = asyncio.Queue()
    asked: list[int] = []
    answered = asyncio.Event()

    async def on_back(since_ms: int) -> None:
        asked.append(since_ms)
        if len(asked) < 3:  # the pool still holds connections broken by the same outage
            raise StoreUnavailable("The response store cannot be reached at the moment; retry shortly.")
        answered.set()

    def on_notice(_connection: Any, _pid: int, _channel: str, payload: str) -> None:
        heard.put_nowait(payload)

    listener = Listener(dsn, {"ors_test_listener": on_notice}, name="test", on_back=on_back)
    await listener.start()
    try:
        await _notify(dsn, "ors_test_listener", "before")
        assert await asyncio.wait_for(heard.get(), 10) == "before"
        connection = listener.connection
        assert connection is not None
        lost_at = time.time_ns() // 1_000_000
        connection.terminate()
        await asyncio.wait_for(answered.wait(), 20)  # a bound, not a measurement
        assert len(asked) == 3 and len(set(asked)) == 1  # each time from the same loss
        assert lost_at <= asked[0] <= time.time_ns() // 1_000_000
        assert listener.connection is not None and listener.connection is not connection
        await _notify(dsn, "ors_test_listener", "after")
        assert await asyncio.wait_for(heard.get(), 10) == "after"
    finally:
        await listener.close()


async def test_a_second_loss_before_the_missed_are_asked_for_keeps_the_first_time(
    postgres_database_url: str,
) -> None:
    dsn = _dsn(postgres_database_url)
    asked: list[int] = []
    answered = asyncio.Event()
    listener: Listener

    async def on_back(since_ms: int) -> None:
        asked.append(since_ms)
        if len(asked) == 1:  # lost again while asking: the answer is not trusted
            connection = listener.connection
            assert connection is not None
            connection.terminate()
            await asyncio.sleep(0.2)
            return
        answered.set()

    listener = Listener(dsn, {"ors_test_listener": lambda *_: None}, name="test", on_back=on_back)
    await listener.start()
    try:
        connection = listener.connection
        assert connection is not None
        connection.terminate()
        await asyncio.wait_for(answered.wait(), 20)  # a bound, not a measurement
        assert len(asked) == 2 and asked[0] == asked[1]
    finally:
        await listener.close()
