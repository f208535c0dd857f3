"""Responses running in this process that other requests may reach: stored runs, found
by id to be fetched, followed or cancelled while they are still being generated, and
background runs, each driven by a task of its own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from app.errors import ORSError, ServerError

if TYPE_CHECKING:
    from app.engine.run import Run

log = logging.getLogger("ors.runs")


class LiveRuns:
    """A registry of running stored runs by id (a ``store: false`` response can never be
    fetched); lookups are scoped by tenant. A run adds itself when its start is recorded
    and leaves when it ends (:mod:`app.engine.run`)."""

    def __init__(self) -> None:
        self._runs: dict[str, Run] = {}
        self._background: set[asyncio.Task[None]] = set()

    def add(self, run: Run) -> None:
        self._runs[run.id] = run

    def discard(self, run: Run) -> None:
        if self._runs.get(run.id) is run:
            del self._runs[run.id]

    def get(self, tenant: str, response_id: str) -> Run | None:
        """The running run, or ``None``: a run whose outcome is final is the store's (it
        may still be delivering its last events to a slow reader)."""
        run = self._runs.get(response_id)
        return run if run is not None and run.tenant == tenant and not run.ended else None

    def relayed(self, tenant: str, response_id: str, after: int) -> AsyncIterator[tuple[int, str, str]] | None:
        """For another process that follows a response (``app.store.relay``): the running
        run's events after sequence number ``after`` as ``(sequence, type, data)``, then
        live ones until its end; ``None`` when it does not run here."""
        run = self.get(tenant, response_id)
        if run is None:
            return None

        async def events() -> AsyncIterator[tuple[int, str, str]]:
            sequence = after
            async for emitted in run.follow(after):
                sequence += 1
                yield sequence, emitted.type, emitted.data

        return events()

    def cancel(self, tenant: str, response_id: str) -> bool:
        """Cancel the run if it runs here (a cancel recorded by another replica, or by
        this one through the store); whether it did."""
        run = self.get(tenant, response_id)
        if run is None:
            return False
        run.cancel()
        return True

    def start_background(self, run: Run) -> None:
        """Drive ``run`` in a task of its own: it goes on whether or not anyone listens.
        Whoever waits for it (:meth:`Run.wait_started`, :meth:`Run.wait_ended`) is
        released however the task ends, even if it is cancelled before it ever runs."""

        async def drive() -> None:
            try:
                await run.final()
            except ORSError as error:
                log.info("background response %s did not start: %r", run.id, error)
            except Exception:
                log.exception("background response %s did not start", run.id)

        task = asyncio.create_task(drive(), name=f"background-{run.id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda _: run.abandon())

    async def drain(self) -> None:
        """End every running run with ``response.failed`` (shutting down), recorded, and
        wait (10 s at most) for the background ones to end."""
        for run in list(self._runs.values()):
            run.interrupt(ServerError("The server is shutting down.", code="server_shutting_down"))
        if self._background:
            await asyncio.wait(set(self._background), timeout=10)
