"""The store the settings ask for."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.store.factory import open_store
from app.store.sql import SqlResponseStore
from tests.store.helpers import new_response

pytestmark = pytest.mark.anyio


async def test_sqlite_under_the_data_dir_by_default(tmp_path: Path) -> None:
    store = open_store(None, tmp_path / "data", "instance")
    assert isinstance(store, SqlResponseStore) and store.url.get_backend_name() == "sqlite"
    await store.open()
    try:
        begun = new_response("tenant")
        await store.begin(begun)
        assert await store.get("tenant", begun.id) is not None
    finally:
        await store.close()
    assert (tmp_path / "data" / "ors.db").is_file()


async def test_database_url_wins(postgres_database_url: str, tmp_path: Path) -> None:
    store = open_store(postgres_database_url, tmp_path, "instance")
    assert isinstance(store, SqlResponseStore) and store.url.get_backend_name() == "postgresql"
    await store.open()
    await store.close()
    assert not (tmp_path / "ors.db").exists()
