"""Ends of responses written late (:meth:`app.store.base.ResponseStore.finish_later`).

When a response's own ``finish`` could not reach the store, its client was told the
response failed; the store should say so too rather than keep it ``in_progress``. Such
an end is kept in memory, by response id, and tried again every
:data:`RETRY_SECONDS`, in the order the ends came, until it is written, found not to be
needed (the response was cancelled or deleted meanwhile, or finished after all), or the
store closes. While the store is out of reach, all of them wait for the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.engine import Connection

from app.errors import StoreUnavailable

log = logging.getLogger("ors.store")

RETRY_SECONDS = 1.0

Work = Callable[[Connection], bool]


class LateEnds:
    """``write(work)`` runs a write of the store (raising
    :class:`~app.errors.StoreUnavailable` while it cannot be reached)."""

    def __init__(self, write: Callable[[Work], Awaitable[Any]]) -> None:
        self._write = write
        self._ends: dict[str, Work] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, response_id: str, work: Work) -> None:
        """Keep ``work`` (the response's end) until it is written; a later end of the same
        response replaces an earlier one."""
        self._ends[response_id] = work
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._retry(), name="store-late-ends")

    async def close(self) -> None:
        """Stop trying; the ends not written are logged as lost."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._ends:
            log.error("The store closes with %d response end(s) it could not write: %s", len(self._ends),
                      ", ".join(self._ends))
            self._ends.clear()

    async def _retry(self) -> None:
        while self._ends:
            await asyncio.sleep(RETRY_SECONDS)
            for response_id, work in list(self._ends.items()):
                try:
                    written = await self._write(work)
                except StoreUnavailable:
                    break
                except Exception:  # a conflict (it did finish after all): nothing to retry
                    log.exception("The late end of response %s could not be written; given up.", response_id)
                else:
                    log.info("The end of response %s, which could not be written then, %s.", response_id,
                             "is written now" if written else "is not needed: it was cancelled or deleted meanwhile")
                self._ends.pop(response_id, None)
