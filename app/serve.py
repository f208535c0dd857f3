"""Running the app under uvicorn, with draining on exit."""

from __future__ import annotations

from types import FrameType
from typing import Any

import uvicorn
from sse_starlette.sse import AppStatus

from app.config import Settings
from app.transport.drain import Drain


def transport_options(settings: Settings) -> dict[str, Any]:
    """uvicorn options that come from the settings: the largest WebSocket message is the
    largest request body (a bigger one closes the connection with 1009)."""
    return {"ws_max_size": settings.max_body_bytes}


class Server(uvicorn.Server):
    """A uvicorn server that starts draining the app's streams as soon as it is asked to
    exit (SIGTERM, SIGINT, or ``handle_exit`` called by an embedding program)."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        # sse-starlette would otherwise cut every open stream on exit with no terminal
        # event, through a process-wide flag that is never reset; the drain ends them.
        AppStatus.disable_automatic_graceful_drain()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.drain.begin()
        super().handle_exit(sig, frame)
