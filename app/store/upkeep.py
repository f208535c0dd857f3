"""The store's periodic upkeep on PostgreSQL: its instance lock, its notice connections,
and the recovery of dead replicas' responses.

Every ``interval`` seconds the store's ``check`` runs (its lock and notice connections
checked and taken again if their connection broke, then recovery). An outage. A
session's locks end with its connection, so when the database is out of reach this
instance's lock (and its ``LISTEN``) goes with it. The first read or write that finds
the database out of reach sets ``out_of_reach``, which wakes the upkeep at once; it then
runs ``check`` every :data:`RECONNECT_SECONDS` until the lock is taken again: the lock
is back within about a second of the database, not at the next period. While the lock
is lost, another replica's recovery may count this instance as dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from app.errors import StoreUnavailable
from app.store.engines import unreachable

log = logging.getLogger("ors.store")

RECONNECT_SECONDS = 1.0


async def keep_up(check: Callable[[], Awaitable[None]], interval: float, out_of_reach: asyncio.Event) -> None:
    """Run ``check`` every ``interval`` seconds, or as soon as ``out_of_reach`` is set and
    then every :data:`RECONNECT_SECONDS` until it passes; until cancelled."""
    lost = False
    while True:
        if lost:  # paced, however many requests find it out of reach meanwhile
            await asyncio.sleep(RECONNECT_SECONDS)
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await out_of_reach.wait()
        out_of_reach.clear()
        try:
            await check()
        except Exception as error:
            if not unreachable(error) and not isinstance(error, StoreUnavailable):
                log.exception("Periodic recovery of the response store failed; retrying later.")
                continue
            if not lost:
                log.warning("The store's instance lock is lost with the database; taking it again every "
                            "%.0f s: %r", RECONNECT_SECONDS, error)
            lost = True
            continue
        if lost:
            log.info("The store's instance lock is taken again.")
        lost = False
