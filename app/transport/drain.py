"""Draining: when the server is asked to stop, open streams end with a terminal event.

uvicorn runs the lifespan shutdown only after open connections have finished, so the
lifespan cannot be the signal. Instead the uvicorn ``Server`` used by ``ors serve``
(:class:`app.serve.Server`) calls :meth:`Drain.begin` from its exit handler; every
stream and WebSocket turn watches :meth:`Drain.wait` and ends its response with
``response.failed`` (code ``server_shutting_down``) before the connection closes.
"""

from __future__ import annotations

import asyncio


class Drain:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._requested = False

    def bind(self) -> None:
        """Attach to the running loop (called from the app's lifespan)."""
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        if self._requested:
            self._event.set()

    def begin(self) -> None:
        """Ask open streams to finish. Safe from any thread, including signal handlers."""
        self._requested = True
        if self._loop is not None and self._event is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    @property
    def draining(self) -> bool:
        return self._requested

    async def wait(self) -> None:
        if self._event is None:
            self.bind()
        assert self._event is not None
        await self._event.wait()
