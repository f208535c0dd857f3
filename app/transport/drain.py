"""Draining: when the server is asked to stop, open streams end with a terminal event.

uvicorn runs the lifespan shutdown only after open connections have finished, so the
lifespan cannot be the signal. Instead the uvicorn ``Server`` used by ``ors serve``
(:class:`app.serve.Server`) calls :meth:`Drain.begin` from its exit handler; every
stream and WebSocket turn is told (:meth:`Drain.when_draining`, or :meth:`Drain.wait`)
and ends its response with ``response.failed`` (code ``server_shutting_down``) before
the connection closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger("ors.drain")


class Drain:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._requested = False
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next = 0

    def bind(self) -> None:
        """Attach to the running loop (called from the app's lifespan)."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        if self._requested:
            self._fire()

    def begin(self) -> None:
        """Ask open streams to finish. Safe from any thread, including signal handlers."""
        self._requested = True
        if self._loop is not None and self._event is not None:
            self._loop.call_soon_threadsafe(self._fire)

    @property
    def draining(self) -> bool:
        return self._requested

    async def wait(self) -> None:
        if self._event is None:
            self.bind()
        assert self._event is not None
        await self._event.wait()

    def when_draining(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (on the event loop) once the drain begins, or soon if it has
        begun; the function returned forgets it. A stream registers here for its
        duration instead of running a task that waits: no task per stream."""
        key = self._next
        self._next += 1
        self._callbacks[key] = callback
        if self._requested:
            asyncio.get_running_loop().call_soon(self._fire)
        return lambda: self._callbacks.pop(key, None)

    def _fire(self) -> None:
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, {}
        for callback in callbacks.values():
            try:
                callback()
            except Exception:
                log.exception("a stream could not be told that the server drains")
