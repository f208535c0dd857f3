"""Stored responses deleted once they are older than the retention (``ORS_RESPONSE_RETENTION_DAYS``).

The contract:

* **What goes.** A finished response created more than the retention ago is deleted as
  ``DELETE /v1/responses/{id}`` deletes it (:meth:`ResponseStore.expire`): hidden at once,
  its content cleared, its items and tools kept only while a visible response's chain
  needs them. So continuing a recent turn of a long conversation still sees the whole
  conversation, while its old turns can no longer be fetched; once its last turn is old
  too, all of it goes. A response still running is never deleted; it goes at a pass
  after it finishes.
* **When.** A pass at start, then every ``every`` seconds: a tenth of the retention, at
  least :data:`MIN_EVERY_SECONDS` and at most :data:`MAX_EVERY_SECONDS` (an hour). A pass
  takes :data:`BATCH` responses at a time, oldest first, each batch found by a reader
  (the scan holds no write lock) and deleted in one write, and yields between batches,
  so the writes of requests wait at most one batch.
* **Replicas.** Each runs its own passes; two that meet on one response delete it once
  (the other finds it gone). A pass that finds the store out of reach ends quietly and
  the next one goes on.
* **Precision.** ``created_at`` is in seconds; a response goes between one and ``every``
  seconds after its time is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from app.errors import StoreUnavailable
from app.store.base import ResponseStore

log = logging.getLogger("ors.store")

BATCH = 100
"""Responses found and deleted per write. A delete walks its chain; on SQLite, whose one
writer serializes every write, a batch holds the other writes for its duration."""
MIN_EVERY_SECONDS = 1.0
MAX_EVERY_SECONDS = 3600.0
SECONDS_PER_DAY = 86_400


class Retention:
    """The periodic passes of one server process (see the module)."""

    def __init__(self, store: ResponseStore, days: float) -> None:
        if days <= 0:
            raise ValueError("the retention is a positive number of days")
        self.store = store
        self.seconds = days * SECONDS_PER_DAY
        self.every = min(MAX_EVERY_SECONDS, max(MIN_EVERY_SECONDS, self.seconds / 10))
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="store-retention")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run_once(self) -> int:
        """One pass: every response past the retention now; how many were deleted."""
        created_before = int(time.time() - self.seconds)
        deleted = 0
        while True:
            found, gone = await self.store.expire(created_before, BATCH)
            deleted += gone
            if found < BATCH:
                return deleted
            await asyncio.sleep(0)  # the requests' writes queued meanwhile go first

    async def _run(self) -> None:
        while True:
            try:
                deleted = await self.run_once()
            except StoreUnavailable:
                deleted = 0  # the store says so where it matters; the next pass goes on
            except Exception:
                log.exception("A pass of the response retention failed; the next one is in %.0f s.", self.every)
                deleted = 0
            if deleted:
                log.info("Deleted %d stored response(s) older than the retention (%g days).", deleted,
                         self.seconds / SECONDS_PER_DAY)
            await asyncio.sleep(self.every)
