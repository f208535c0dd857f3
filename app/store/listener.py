"""A dedicated ``LISTEN`` connection that comes back when it is lost.

PostgreSQL delivers a notice to the sessions that ``LISTEN`` on its channel. A pooled
connection is reset when it goes back to the pool (which drops ``LISTEN``), so each
listener (cancel notices, :mod:`app.store.cancels`; the event relay,
:mod:`app.store.relay`) holds one asyncpg connection of its own, outside the store's
pool. The contract:

* **Lost.** The connection is known lost when asyncpg reports it (its termination
  listener), when a statement its owner sent on it failed (:meth:`Listener.lost`), or
  when :meth:`Listener.heartbeat` (run by the store's periodic task) fails.
  :attr:`Listener.connection` is then ``None``.
* **Back.** One task connects again, waiting :data:`RECONNECT_SECONDS` between attempts
  (the last wait repeats), listens on every channel again, then awaits ``on_back(since_ms)``:
  notices sent while nobody listened are gone, and the owner asks the store (or the
  other replicas) for what it may have missed since the time of the first loss.
  ``on_back`` that fails because the database is still out of reach is tried again
  (the pool may still hold connections that broke with the same outage); a loss during
  ``on_back`` keeps the earlier time, so a second loss never narrows what is asked for.
* Callbacks run on the event loop and must not block.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import asyncpg

from app.errors import StoreUnavailable
from app.store.engines import unreachable

log = logging.getLogger("ors.store")

RECONNECT_SECONDS = (0.1, 0.5, 1.0, 2.0, 5.0)
"""Waits between reconnection attempts (the last one repeats)."""

NoticeCallback = Callable[[Any, int, str, str], None]
"""asyncpg's notice callback: ``(connection, pid, channel, payload)``."""
OnBack = Callable[[int], Awaitable[None]]
"""Awaited once listening again, with the time (ms) the connection was first lost."""


def _wait(attempt: int) -> float:
    return RECONNECT_SECONDS[min(attempt, len(RECONNECT_SECONDS) - 1)]


class Listener:
    """``LISTEN`` on ``channels`` (channel → callback) on a connection of its own; see the
    module for the contract. ``name`` says what it is for in the log."""

    def __init__(self, dsn: str, channels: Mapping[str, NoticeCallback], *, name: str,
                 on_back: OnBack | None = None) -> None:
        self._dsn = dsn
        self._channels = dict(channels)
        self._name = name
        self._on_back = on_back
        self.connection: asyncpg.Connection | None = None
        self._connecting = False
        """Lost, and not listening again yet."""
        self._tasks: set[asyncio.Task[None]] = set()
        """Reconnections (each with its asking for what was missed), cancelled at close."""
        self._lost_at_ms: int | None = None
        """The time of the first loss whose missed notices are not yet asked for."""
        self._closed = False

    async def start(self) -> None:
        """Listen (once; a listener reconnecting already is left to it)."""
        if self.connection is None and not self._connecting:
            self.connection = await self._listen()

    async def _listen(self) -> asyncpg.Connection:
        connection = await asyncpg.connect(self._dsn)
        try:
            for channel, callback in self._channels.items():
                await connection.add_listener(channel, callback)
        except BaseException:
            await connection.close()
            raise
        connection.add_termination_listener(self._on_terminated)
        return connection

    def _on_terminated(self, connection: Any) -> None:
        if connection is self.connection:
            self.lost(None)

    def lost(self, error: BaseException | None) -> None:
        """The connection is gone (``error``: what said so): reconnect in the background."""
        if self._closed or self._connecting:
            return
        log.warning("The %s connection was lost; reconnecting.", self._name, exc_info=error)
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.terminate()
        if self._lost_at_ms is None:
            self._lost_at_ms = time.time_ns() // 1_000_000
        self._connecting = True
        task = asyncio.create_task(self._reconnect(), name=f"ors-{self._name}-listener")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reconnect(self) -> None:
        attempt = 0
        while not self._closed:
            try:
                connection = await self._listen()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
                wait = _wait(attempt)
                attempt += 1
                log.warning("Could not listen for the %s (%r); retrying in %.1f s.", self._name, error, wait)
                await asyncio.sleep(wait)
                continue
            self.connection = connection
            self._connecting = False
            log.info("The %s connection is back.", self._name)
            break
        await self._back()

    async def _back(self) -> None:
        """``on_back`` for the time of the first loss, until it succeeds, the database
        stays out of reach only as long as the connection stays up, or a new loss hands
        it to the next reconnection."""
        attempt = 0
        while (since := self._lost_at_ms) is not None and not self._closed and not self._connecting:
            try:
                if self._on_back is not None:
                    await self._on_back(since)
            except Exception as error:
                if not unreachable(error) and not isinstance(error, StoreUnavailable):
                    log.exception("The %s connection is back, but what it missed could not be asked for.",
                                  self._name)
                    self._lost_at_ms = None
                    return
                wait = _wait(attempt)
                attempt += 1
                await asyncio.sleep(wait)
                continue
            if not self._connecting:  # not lost again meanwhile
                self._lost_at_ms = None

    async def heartbeat(self) -> None:
        """Make sure the connection is still there (a silent loss is found here)."""
        connection = self.connection
        if connection is None:
            return
        try:
            await connection.fetchval("SELECT 1")
        except Exception as error:  # noqa: BLE001 - any failure means the connection is gone
            if connection is self.connection:
                self.lost(error)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close(timeout=5)
