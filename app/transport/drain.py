"""Draining: when the server is asked to stop, open streams end with a terminal event.

uvicorn runs the lifespan shutdown only after open connections have finished, so the
lifespan cannot be the signal. Instead the uvicorn ``Server`` used by ``ors serve``
(:class:`app.serve.Server`) calls :meth:`Drain.begin` from its exit handler; every
stream and WebSocket turn is told (:meth:`Drain.when_draining`, or :meth:`Drain.wait`)
and ends its response with ``response.failed`` (code ``server_shutting_down``) before
the connection closes.

uvicorn's own shutdown closes every WebSocket connection at once (code 1012), whatever
it is sending: a connection's response must have ended before that. So a WebSocket
connection holds the drain while it is open (:meth:`Drain.hold`), and the exit handler
lets uvicorn shut down only once the drain is over (the ``then`` of :meth:`Drain.begin`):
when every connection held has closed itself after its last event, or after
:data:`HOLD_SECONDS` at most. (An HTTP stream needs no hold: uvicorn lets a response
that is being sent finish.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger("ors.drain")

HOLD_SECONDS = 30.0
"""How long the drain waits for the connections that hold it before it is over anyway."""


class Drain:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._requested = False
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next = 0
        self._holds = 0
        self._then: list[Callable[[], None]] = []
        self._timer: asyncio.TimerHandle | None = None

    def bind(self) -> None:
        """Attach to the running loop (called from the app's lifespan)."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        if self._requested:
            self._fire()

    def begin(self, then: Callable[[], None] | None = None) -> None:
        """Ask open streams to finish; ``then`` is called once the drain is over (every
        hold released, :data:`HOLD_SECONDS` at most; at once when the server does not
        run). Safe from any thread, including signal handlers; a second call adds its
        ``then``."""
        self._requested = True
        loop = self._loop
        if loop is None or loop.is_closed():
            if then is not None:
                then()
            return
        loop.call_soon_threadsafe(self._fire, then)

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

    def hold(self) -> Callable[[], None]:
        """Hold the drain open until the function returned is called (once): a connection
        that must close itself before the server shuts connections down."""
        self._holds += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._holds -= 1
                if self._requested and not self._holds:
                    self._over()

        return release

    def _fire(self, then: Callable[[], None] | None = None) -> None:
        if then is not None:
            self._then.append(then)
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, {}
        for callback in callbacks.values():
            try:
                callback()
            except Exception:
                log.exception("a stream could not be told that the server drains")
        if not self._holds:
            self._over()
        elif self._timer is None and self._loop is not None:
            self._timer = self._loop.call_later(HOLD_SECONDS, self._over)

    def _over(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        thens, self._then = self._then, []
        for then in thens:
            then()
