"""Running the app under uvicorn, with draining on exit."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

from app import logs
from app.config import Settings
from app.transport.drain import Drain

HTTP_IMPLEMENTATION = "h11"
"""uvicorn's HTTP/1.1 implementation: h11, which frames a body of unknown length (a
stream) for an HTTP/1.0 client as HTTP/1.0 allows, by closing the connection after it
(an HTTP/1.0 client cannot read a chunked body)."""


def transport_options(settings: Settings) -> dict[str, Any]:
    """uvicorn options that come from the settings: the largest WebSocket message is the
    largest request body (a bigger one closes the connection with 1009). What uvicorn
    does not bound (how long a client may take to send its request's headers) is the
    reverse proxy's to bound (README, "Behind a reverse proxy")."""
    return {"ws_max_size": settings.max_body_bytes, "http": HTTP_IMPLEMENTATION}


def drain_on_exit_signals(drain: Drain) -> None:
    """In a worker process (``--workers N``), where uvicorn's own server handles the
    signals: chain SIGTERM and SIGINT so that the worker's streams drain first, and
    uvicorn's handler runs once the drain is over, as :class:`Server` does in a single
    process. Called once the worker serves (uvicorn has installed its handlers by then)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(number: int, frame: FrameType | None, previous: Any = previous) -> None:
            if drain.draining:  # asked again: uvicorn's handler at once (a second one forces)
                previous(number, frame)
            else:
                drain.begin(then=lambda: previous(number, frame))

        signal.signal(sig, handler)


class Server(uvicorn.Server):
    """A uvicorn server that drains the app's streams as soon as it is asked to exit
    (SIGTERM, SIGINT, or ``handle_exit`` called by an embedding program), and begins its
    own shutdown (which closes every WebSocket connection at once) when the drain is
    over (:mod:`app.transport.drain`). Asked again meanwhile, it begins it at once."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.draining:
            super().handle_exit(sig, frame)
        else:
            self.drain.begin(then=lambda: super(Server, self).handle_exit(sig, frame))

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, with the log written out once the server has finished: the signal
        that stopped it is raised again on the way out, and ends the process before
        exit handlers could write the lines still queued (:func:`app.logs.flush`)."""
        with super().capture_signals():
            try:
                yield
            finally:
                logs.flush()
