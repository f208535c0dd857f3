"""The chain of a recorded response is kept in memory (HistoryCache): the next turn gets
the same history the store would give, without reloading the chain, and visibility is
still the store's to decide."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.backends.scripted import ScriptedBackend, text_script
from app.engine.engine import Engine
from app.engine.history import HistoryCache, StoredHistory
from app.engine.models import ModelRouter
from app.errors import PreviousResponseNotFound
from app.store.engines import sqlite_url
from app.store.sql import SqlResponseStore
from tests.engine.conftest import run_of

pytestmark = pytest.mark.anyio


async def _chain_of_three(store: SqlResponseStore, engine: Engine) -> list[str]:
    ids: list[str] = []
    for word in ("one", "two", "three"):
        body: dict[str, Any] = {"model": "m", "input": word}
        if ids:
            body["previous_response_id"] = ids[-1]
        run = await run_of(engine, body, history=StoredHistory(store, "t", engine.history_cache))
        await run.final()
        ids.append(run.id)
    return ids


async def test_a_cached_history_equals_the_stored_one(tmp_path: Path) -> None:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "i")
    await store.open()
    try:
        engine = Engine(ModelRouter([ScriptedBackend({"m": text_script("ok")})], "m"), store=store,
                        history_cache=HistoryCache(16))
        ids = await _chain_of_three(store, engine)
        assert engine.history_cache is not None
        cached = await StoredHistory(store, "t", engine.history_cache).load(ids[-1])
        assert engine.history_cache.get("t", ids[-1]) is cached
        fresh = await StoredHistory(store, "t").load(ids[-1])
        assert cached.stored_items == fresh.stored_items and cached.tools == fresh.tools
        assert [type(item) for item in cached.items] == [type(item) for item in fresh.items]
        assert [item.model_dump() for item in cached.items] == [item.model_dump() for item in fresh.items]  # type: ignore[attr-defined]
        assert engine.history_cache.get("other-tenant", ids[-1]) is None
    finally:
        await store.close()


async def test_a_deleted_response_is_gone_even_when_cached(tmp_path: Path) -> None:
    store = SqlResponseStore(sqlite_url(tmp_path / "ors.db"), "i")
    await store.open()
    try:
        engine = Engine(ModelRouter([ScriptedBackend({"m": text_script("ok")})], "m"), store=store,
                        history_cache=HistoryCache(16))
        ids = await _chain_of_three(store, engine)
        assert engine.history_cache.get("t", ids[-1]) is not None
        assert await store.delete("t", ids[-1])
        with pytest.raises(PreviousResponseNotFound):
            await StoredHistory(store, "t", engine.history_cache).load(ids[-1])
    finally:
        await store.close()


def test_least_recently_used_out() -> None:
    from app.engine.history import History

    cache = HistoryCache(2)
    for name in ("a", "b", "c"):
        cache.remember("t", name, History(), [], [])
    assert cache.get("t", "a") is None and cache.get("t", "b") is not None and cache.get("t", "c") is not None
    assert HistoryCache(0).get("t", "x") is None


def test_a_chain_keeps_each_tool_once_with_its_latest_definition() -> None:
    from app.engine.history import merge_tools

    old = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    new = {"type": "function", "name": "f", "parameters": {"type": "object", "required": ["x"]}}
    other = {"type": "function", "name": "g"}
    spawn = {"type": "function", "name": "f", "namespace": "agents"}
    tools: list[dict[str, object]] = []
    for _ in range(100):
        tools = merge_tools(tools, [old, other, spawn])
    assert tools == [old, other, spawn]
    assert merge_tools(tools, [new]) == [other, spawn, new]
