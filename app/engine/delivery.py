"""How a run's response is delivered, and what follows from it.

A transport names the delivery when it asks for a run
(:meth:`app.engine.engine.Engine.run`); the run decides everything else from it: which
events it makes, whether the backend may answer in one piece, and when a stored
response is recorded (:mod:`app.engine.run`).

========== ============================ ========================================
delivery   events                       recording (``store: true``)
========== ============================ ========================================
JSON       none (nobody reads them)     once, whole, at the end; no events kept
SSE        each, as made                the start before the first event, the end
                                        (with the events) before the terminal one
WEBSOCKET  each, without ``error``      as SSE
           before ``response.failed``
BACKGROUND each, followed by readers    as SSE, the run driven by a task of its
                                        own; the response starts ``queued``
========== ============================ ========================================
"""

from __future__ import annotations

import enum


class Delivery(enum.Enum):
    JSON = "json"
    """One document, the final response, answered when the run ends."""
    SSE = "sse"
    """Server-sent events, as the run makes them."""
    WEBSOCKET = "websocket"
    """WebSocket frames, one event each."""
    BACKGROUND = "background"
    """Run by a task of its own, whoever listens; followed through its kept events."""

    @property
    def streams(self) -> bool:
        """Whether the response's events are read (its id is known before it ends)."""
        return self is not Delivery.JSON

    @property
    def error_events(self) -> bool:
        """Whether ``response.failed`` follows an ``error`` event (not on a WebSocket)."""
        return self is not Delivery.WEBSOCKET
