"""The model's output on its way to a run: one pump task, a bounded queue, a control cell.

A :class:`Feed` runs the backend's stream in a task of its own (the pump), through the
tool policy and a strict output format's check, and puts what passes on a bounded
``asyncio.Queue``: a slow reader slows the pump (it waits for room), never the other
way round. After the deltas comes :data:`END`, or the exception the stream raised.

Control (:meth:`Feed.signal`: a cancel, or an interruption for shutdown or the
connection cap) never goes through the queue, so it can neither fail on a full queue
nor wait behind queued deltas. The first signal wins and is kept in a one-slot cell;
it cancels the pump (which closes the backend's stream: generation stops even while
nobody reads), and :meth:`Feed.next` returns it before anything still queued. A
consumer blocked on an empty queue is woken by :data:`WAKE`, put only when there is
room (a queue that holds anything does not block its consumer).

A warm-up's feed (``warm_only``) asks the backend only to warm its prompt cache
(:meth:`~app.backends.base.Backend.warm`, which returns at once), then queues a
``Finish`` with zero usage: the response completes with no output.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from app.backends.base import (
    Backend,
    CompactionDelta,
    Delta,
    Finish,
    GenerationRequest,
    McpApprovalRequestDelta,
    McpCallDelta,
    McpListToolsDelta,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolSearchCallDelta,
    ToolSearchOutputDelta,
    Usage,
)
from app.engine.mcp_loop import McpSetup, mcp_running
from app.engine.output_format import checks_output_format, enforce_output_format
from app.engine.tool_search import ToolSurface
from app.engine.tool_search_loop import searching
from app.engine.tools import ToolCallGuard, enforce_tool_policy
from app.errors import ORSError

QUEUE_SIZE = 256

DELTAS = (TextDelta, ReasoningDelta, ToolCallDelta, CompactionDelta, Finish, ToolSearchCallDelta,
          ToolSearchOutputDelta, McpListToolsDelta, McpCallDelta, McpApprovalRequestDelta)
"""What the queue carries most: the backend's deltas."""

END = object()
"""Queued after the backend's last delta."""
WAKE = object()
"""Queued to wake a consumer blocked on an empty queue when a signal arrives; it carries
nothing (the signal is in the cell)."""


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The client asked to stop: the response ends ``cancelled``."""


@dataclass(frozen=True, slots=True)
class Interrupted:
    """The server ends the response early with ``error`` (shutdown, the connection cap)."""

    error: ORSError


Signal = Cancelled | Interrupted


class Feed:
    """The output of one backend stream (see the module docstring). :meth:`start` it
    once; :meth:`stop` it to end the stream and wait until it is closed."""

    __slots__ = ("backend", "request", "name", "warm_only", "surface", "mcp", "control", "_queue", "_pump")

    def __init__(self, backend: Backend, request: GenerationRequest, *, name: str, warm_only: bool = False,
                 surface: ToolSurface | None = None, mcp: McpSetup | None = None) -> None:
        self.backend = backend
        self.request = request
        self.name = name
        self.warm_only = warm_only
        self.surface = surface
        self.mcp = mcp
        """The request's tool search, if it offers one: a server-run search this server
        runs wraps the backend's stream (:mod:`app.engine.tool_search_loop`)."""
        self.control: Signal | None = None
        """The first signal, once one came."""
        self._queue: asyncio.Queue[object] = asyncio.Queue(QUEUE_SIZE)
        self._pump: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the pump task (once; never after a signal)."""
        if self._pump is None and self.control is None:
            self._pump = asyncio.create_task(self._run(), name=self.name)

    def signal(self, signal: Signal) -> bool:
        """Record ``signal`` unless one came before, and make it take effect at once;
        whether it was the first. Never blocks, never raises."""
        if self.control is not None:
            return False
        self.control = signal
        if self._pump is not None:
            self._pump.cancel()
        if not self._queue.full():
            self._queue.put_nowait(WAKE)
        return True

    async def next(self) -> object:
        """The signal if one came, else the next queued item (waiting for one): a
        delta, :data:`END`, the stream's exception, or :data:`WAKE`."""
        if self.control is not None:
            return self.control
        got = await self._queue.get()
        return self.control or got

    def ready(self) -> object | None:
        """The next queued item if there is one and no signal came, without waiting;
        else ``None``."""
        if self.control is not None:
            return None
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None

    def idle(self) -> bool:
        """Whether nothing is queued (or a signal came): a consumer would wait."""
        return self.control is not None or self._queue.empty()

    def settled(self) -> bool:
        """Whether the pump has nothing left to do or raise: never started, cancelled,
        or over."""
        pump = self._pump
        return pump is None or (pump.done() and (pump.cancelled() or pump.exception() is None))

    def cancel(self) -> None:
        """Cancel the pump, if it runs (its stream is closed as it ends)."""
        if self._pump is not None:
            self._pump.cancel()

    async def stop(self) -> None:
        """Cancel the pump, if any, and wait until it has closed the backend's stream."""
        pump = self._pump
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    async def _run(self) -> None:
        """Move the backend's deltas into the queue through the tool policy (a
        :class:`ToolCallGuard` called in this loop); owns (and always closes) the
        stream. A strict ``text.format`` is checked on what the policy passed, so with
        one the policy runs as a generator below the format's check."""
        request, surface = self.request, self.surface
        queue = self._queue
        if self.warm_only:
            await self.backend.warm(request)
            await queue.put(Finish("stop", Usage()))
            await queue.put(END)
            return
        rounds: Callable[[GenerationRequest], AsyncIterator[Delta]] = self.backend.stream
        if surface is not None and surface.runs_here:
            rounds = functools.partial(searching, self.backend, surface=surface)
        source = rounds(request) if self.mcp is None else mcp_running(rounds, request, self.mcp)
        guard: ToolCallGuard | None = None
        stream: AsyncIterator[Delta]
        if checks_output_format(request):
            stream = enforce_output_format(enforce_tool_policy(source, request, surface), request)
        else:
            stream, guard = source, ToolCallGuard(request, surface)
        try:
            async for delta in stream:
                passed = delta if guard is None else guard.feed(delta)
                if isinstance(passed, list):  # calls released, a finish: a few per response
                    for each in passed:
                        await queue.put(each)
                    continue
                try:
                    queue.put_nowait(delta)
                except asyncio.QueueFull:  # the consumer is behind: wait for room
                    await queue.put(delta)
            await queue.put(END)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put(exc)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]  # backends' streams are async generators
