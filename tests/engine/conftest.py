"""For the engine's tests: the real SQL store on SQLite (``store``), and a count of the
writes made on it (:func:`counted_writes`; the counted methods still run)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.store.engines import sqlite_url
from app.store.sql import SqlResponseStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqlResponseStore]:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "instance")
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def counted_writes(store: SqlResponseStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the store's writes, in order, as they are called."""
    calls: list[str] = []
    for name in ("begin", "finish", "record"):
        real = getattr(store, name)

        async def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls.append(_name)
            return await _real(*args, **kwargs)

        monkeypatch.setattr(store, name, counted)
    return calls
