"""Choosing the store from the settings."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from app.store.base import ResponseStore
from app.store.engines import sqlite_url
from app.store.sql import SqlResponseStore

SQLITE_FILE = "ors.db"


def store_url(database_url: str | None, data_dir: Path) -> str:
    """``database_url`` if set, else the embedded SQLite file ``<data_dir>/ors.db``."""
    return database_url or sqlite_url(data_dir / SQLITE_FILE)


def open_store(database_url: str | None, data_dir: Path, instance_id: str,
               positional_tenants: Mapping[str, str] | None = None) -> ResponseStore:
    """The store for these settings, not yet opened: the caller awaits ``open()`` (which
    connects, migrates and recovers) and later ``close()``. ``instance_id`` must be
    unique per server start; ``positional_tenants`` goes to the migrations."""
    return SqlResponseStore(store_url(database_url, data_dir), instance_id, positional_tenants=positional_tenants)
