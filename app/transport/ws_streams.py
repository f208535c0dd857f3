"""The streams of one WebSocket connection: who runs now, who waits, who is refused.

A stream is a lane of turns, named by the ``stream_id`` of its ``response.create``
frames; frames without one (and frames that cannot be read) make one stream of their
own, named ``None``, which is all a client that never sends ``stream_id`` sees.

* **In order within a stream, at once across streams.** Each stream with work has one
  worker task that runs its frames one after another, first come first served; the
  workers of different streams run concurrently.
* **Bounds, checked as a frame arrives** (:meth:`Streams.refusal`): at most
  ``max_queued`` frames wait behind a stream's running turn (one more: 429
  ``too_many_queued_frames``, param ``type``), and at most ``max_streams`` streams hold
  work at once (a frame for one more: 429 ``too_many_streams``, param ``stream_id``).
  A stream whose last frame has been handled holds nothing: it may run again later.
* **Ending.** :meth:`Streams.stop` makes every worker stop after its current turn (what
  still waits is dropped); :meth:`Streams.cancel` cancels them at once. Either way each
  frame is handed to ``release`` exactly once, run or dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable

from app.engine.run import Run
from app.errors import ORSError, TooManyRequests
from app.transport.ws_frames import Frame


class Lane:
    """One stream: its waiting frames, whether a frame is being handled, the response
    it runs (once its run exists), and its worker task while it has work."""

    __slots__ = ("key", "frames", "busy", "run", "task")

    def __init__(self, key: str | None) -> None:
        self.key = key
        self.frames: deque[Frame] = deque()
        self.busy = False
        self.run: Run | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        """Frames waiting, plus the one being handled."""
        return len(self.frames) + self.busy


class Streams:
    """The lanes of one connection (see the module docstring). ``turn`` handles one
    frame of a lane; ``release`` is called once per frame, once it is handled or dropped."""

    def __init__(self, *, max_streams: int, max_queued: int, turn: Callable[[Lane, Frame], Awaitable[None]],
                 release: Callable[[Frame], None]) -> None:
        self.max_streams = max_streams
        self.max_queued = max_queued
        self._turn = turn
        self._release = release
        self.lanes: dict[str | None, Lane] = {}
        self.stopping = False

    def refusal(self, key: str | None) -> ORSError | None:
        """Why a frame for stream ``key`` arriving now is refused, if it is."""
        lane = self.lanes.get(key)
        if lane is None:
            if len(self.lanes) >= self.max_streams:
                return TooManyRequests(
                    f"This connection already has {self.max_streams} streams with responses running or waiting; "
                    "this frame was dropped. Wait for a stream's turns to end, or open another connection.",
                    code="too_many_streams", param="stream_id")
            return None
        if lane.pending > self.max_queued:  # it would wait behind the running turn and max_queued others
            return TooManyRequests(
                f"Too many response.create frames are waiting on this {'stream' if key is not None else 'connection'} "
                f"(at most {self.max_queued} behind the running one); this one was dropped. Wait for a turn to "
                "end, or open another connection.",
                code="too_many_queued_frames", param="type")
        return None

    def put(self, key: str | None, frame: Frame) -> None:
        """Queue ``frame`` on stream ``key`` (:meth:`refusal` said yes)."""
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = Lane(key)
        lane.frames.append(frame)
        if lane.task is None and not self.stopping:
            lane.task = asyncio.create_task(self._work(lane), name=f"ws-stream-{key}")

    def running(self) -> list[Run]:
        """The responses running now, one per stream at most."""
        return [lane.run for lane in self.lanes.values() if lane.run is not None]

    def tasks(self) -> list[asyncio.Task[None]]:
        return [lane.task for lane in self.lanes.values() if lane.task is not None]

    def stop(self) -> None:
        """Let each worker end its current turn, then stop: nothing waiting runs."""
        self.stopping = True

    async def cancel(self, tasks: list[asyncio.Task[None]] | None = None) -> None:
        """Cancel the workers (``tasks``, else all) and wait for them; then release every
        frame still waiting."""
        tasks = self.tasks() if tasks is None else tasks
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.drop_waiting()

    def drop_waiting(self) -> None:
        """Release the frames that never ran (their room among the bodies in flight)."""
        for lane in list(self.lanes.values()):
            while lane.frames:
                self._release(lane.frames.popleft())
            if lane.task is None and not lane.busy:
                self.lanes.pop(lane.key, None)

    async def _work(self, lane: Lane) -> None:
        try:
            while lane.frames and not self.stopping:
                frame = lane.frames.popleft()
                lane.busy = True
                try:
                    await self._turn(lane, frame)
                finally:
                    lane.busy = False
                    lane.run = None
                    self._release(frame)
        finally:
            lane.task = None
            if not lane.frames and self.lanes.get(lane.key) is lane:
                del self.lanes[lane.key]
