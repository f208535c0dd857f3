"""The event relay between two processes (two relays here, on the real PostgreSQL server):
a follower gets every event of a response another process runs, in order and without a
gap, also when its own listening connection is lost and comes back meanwhile."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.engine import make_url

from app.store.relay import PostgresEventRelay, RelayedEvent

pytestmark = pytest.mark.anyio


class Running:
    """The live events of one response, as the process that runs it has them."""

    def __init__(self, response_id: str) -> None:
        self.response_id = response_id
        self.events: list[tuple[int, str, str]] = []
        self._changed = asyncio.Condition()

    async def emit(self, kind: str) -> None:
        sequence = len(self.events)
        self.events.append((sequence, kind, json.dumps({"type": kind, "sequence_number": sequence})))
        async with self._changed:
            self._changed.notify_all()

    def source(self, _tenant: str, response_id: str, after: int) -> AsyncIterator[tuple[int, str, str]] | None:
        if response_id != self.response_id:
            return None
        return self._after(after)

    async def _after(self, after: int) -> AsyncIterator[tuple[int, str, str]]:
        sent = after + 1
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda sent=sent: len(self.events) > sent)
            for event in self.events[sent:]:
                yield event
                if event[1] == "response.completed":
                    return
            sent = len(self.events)


async def _not_ended(_tenant: str, _response_id: str) -> list[str] | None:
    return None


async def test_a_follower_whose_connection_is_lost_gets_every_event_once_it_is_back(
    postgres_database_url: str,
) -> None:
    dsn = make_url(postgres_database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    running = Running("resp_relayed")
    owner, follower = PostgresEventRelay(dsn), PostgresEventRelay(dsn)
    await owner.start(running.source)
    await follower.start(lambda *_: None)
    received: list[RelayedEvent] = []
    first = asyncio.Event()

    async def follow() -> None:
        async for event in follower.follow("tenant", "resp_relayed", None, _not_ended):
            received.append(event)
            first.set()

    following = asyncio.create_task(follow())
    try:
        await running.emit("response.created")
        await asyncio.wait_for(first.wait(), 10)
        connection = follower._listener.connection
        assert connection is not None
        connection.terminate()  # lost: what is relayed meanwhile does not reach the follower
        await running.emit("response.in_progress")
        await running.emit("response.output_text.delta")
        await running.emit("response.completed")
        await asyncio.wait_for(following, 20)  # a bound, not a measurement
    finally:
        following.cancel()
        await follower.close()
        await owner.close()
    assert [event.sequence_number for event in received] == [0, 1, 2, 3]
    assert [event.type for event in received] == ["response.created", "response.in_progress",
                                                  "response.output_text.delta", "response.completed"]
