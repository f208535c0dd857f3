"""Choosing the store from the settings."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from app.store.base import ResponseStore
from app.store.engines import sqlite_url, unreachable
from app.store.sql import SqlResponseStore

log = logging.getLogger("ors.store")

SQLITE_FILE = "ors.db"
OPEN_RETRY_SECONDS = 1.0


def store_url(database_url: str | None, data_dir: Path) -> str:
    """``database_url`` if set, else the embedded SQLite file ``<data_dir>/ors.db``."""
    return database_url or sqlite_url(data_dir / SQLITE_FILE)


def open_store(database_url: str | None, data_dir: Path, instance_id: str,
               positional_tenants: Mapping[str, str] | None = None) -> ResponseStore:
    """The store for these settings, not yet opened: the caller awaits ``open()`` (which
    connects, migrates and recovers) and later ``close()``. ``instance_id`` must be
    unique per server start; ``positional_tenants`` goes to the migrations."""
    return SqlResponseStore(store_url(database_url, data_dir), instance_id, positional_tenants=positional_tenants)


async def open_when_reachable(store: ResponseStore, wait_seconds: float) -> None:
    """``store.open()``. While its database cannot be reached (it may start after the
    server, as in a compose file or a pod), tried again every :data:`OPEN_RETRY_SECONDS`
    for up to ``wait_seconds``, with one warning; then the last error is raised, after a
    line that says why. Any other failure (a refused login, a store in use) is raised at
    once."""
    deadline = time.monotonic() + wait_seconds
    waited = False
    while True:
        try:
            await store.open()
        except Exception as error:
            if not unreachable(error):
                raise
            if time.monotonic() + OPEN_RETRY_SECONDS > deadline:
                log.error("The database could not be reached%s; the server cannot start without its store: %r",
                          f" for {wait_seconds:g} s" if waited else "", error)
                raise
            if not waited:
                log.warning("The database cannot be reached (%r); trying again every %g s for up to %g s "
                            "(ORS_DATABASE_WAIT_SECONDS).", error, OPEN_RETRY_SECONDS, wait_seconds)
                waited = True
            await asyncio.sleep(OPEN_RETRY_SECONDS)
            continue
        if waited:
            log.info("The database is reachable: the store is open.")
        return
