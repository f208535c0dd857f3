"""Responses running in this process: background runs, and stored responses that a
client may fetch or follow while they are still being generated."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from app.engine.turn import Turn
from app.errors import ORSError, ServerError

log = logging.getLogger("ors.runs")


class _Tracking:
    __slots__ = ("turns", "turn")

    def __init__(self, turns: dict[str, Turn], turn: Turn) -> None:
        self.turns = turns
        self.turn = turn

    def __enter__(self) -> None:
        self.turns[self.turn.id] = self.turn

    def __exit__(self, *_: object) -> None:
        self.turns.pop(self.turn.id, None)


_UNTRACKED = contextlib.nullcontext()
"""What a turn nobody can look up is tracked with: nothing (reusable)."""


class LiveTurns:
    """A registry of running turns by id. Only stored turns are registered (a
    ``store: false`` response can never be fetched); lookups are scoped by tenant."""

    def __init__(self) -> None:
        self._turns: dict[str, Turn] = {}
        self._background: set[asyncio.Task[None]] = set()

    def get(self, tenant: str, response_id: str) -> Turn | None:
        """The running turn, or ``None``: a turn whose outcome is final is the store's
        (it may still be delivering its last events to a slow reader)."""
        turn = self._turns.get(response_id)
        return turn if turn is not None and turn.tenant == tenant and not turn.ended else None

    def relayed(self, tenant: str, response_id: str, after: int) -> AsyncIterator[tuple[int, str, str]] | None:
        """For another process that follows a response (``app.store.relay``): the running
        turn's events after sequence number ``after`` as ``(sequence, type, data)``, then
        live ones until its end; ``None`` when it does not run here."""
        turn = self.get(tenant, response_id)
        if turn is None:
            return None

        async def events() -> AsyncIterator[tuple[int, str, str]]:
            sequence = after
            async for emitted in turn.follow(after):
                sequence += 1
                yield sequence, emitted.type, emitted.data

        return events()

    def cancel(self, tenant: str, response_id: str) -> bool:
        """Cancel the turn if it runs here (a cancel recorded by another replica, or by
        this one through the store); whether it did."""
        turn = self.get(tenant, response_id)
        if turn is None:
            return False
        turn.cancel()
        return True

    def tracking(self, turn: Turn) -> contextlib.AbstractContextManager[None]:
        """While the block runs (a transport driving ``turn.batches()``), a stored turn is
        found by its id: retrieved, followed or cancelled by another request. (Plain
        objects, not a generator: entered by every request.)"""
        if turn.store is None:
            return _UNTRACKED
        return _Tracking(self._turns, turn)

    def start_background(self, turn: Turn, on_end: Callable[[], Awaitable[None]] | None = None) -> None:
        """Run ``turn`` in a task of its own: it goes on whether or not anyone listens.
        Whoever waits for it (:meth:`Turn.wait_started`, :meth:`Turn.wait_ended`) is
        released however the task ends, even if it is cancelled before it ever runs.
        ``on_end`` is awaited when the run ends, however it ends (a task cancelled before
        it ever ran, at shutdown, does not call it)."""

        async def run() -> None:
            try:
                with self.tracking(turn):
                    try:
                        await turn.run()
                    except ORSError as error:
                        log.info("background response %s did not start: %r", turn.id, error)
                    except Exception:
                        log.exception("background response %s did not start", turn.id)
            finally:
                if on_end is not None:
                    await on_end()

        task = asyncio.create_task(run(), name=f"background-{turn.id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda _: turn.abandon())

    async def drain(self) -> None:
        """End every background run with ``response.failed`` (shutting down), recorded."""
        for turn in list(self._turns.values()):
            turn.interrupt(ServerError("The server is shutting down.", code="server_shutting_down"))
        if self._background:
            await asyncio.wait(set(self._background), timeout=10)
