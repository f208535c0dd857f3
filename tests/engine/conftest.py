"""For the engine's tests: the real SQL store on SQLite (``store``), a count of the
writes made on it (:func:`counted_writes`; the counted methods still run), and runs made
as a transport makes them (:func:`run_of`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from app.engine.delivery import Delivery
from app.engine.engine import Engine
from app.engine.history import HistorySource, NoHistory
from app.engine.run import Run
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


def delivery_of(body: dict[str, Any]) -> Delivery:
    """The delivery the HTTP transport gives a request body."""
    if body.get("background"):
        return Delivery.BACKGROUND
    return Delivery.SSE if body.get("stream") else Delivery.JSON


async def run_of(engine: Engine, body: dict[str, Any], delivery: Delivery | None = None, *,
                 history: HistorySource | None = None, on_end: Callable[[], Awaitable[None]] | None = None) -> Run:
    """``body`` prepared (tenant ``t``) and made a run, as a transport does."""
    prepared = await engine.prepare(body, tenant="t", history=history or NoHistory())
    return await engine.run(prepared, delivery or delivery_of(body), on_end=on_end)
