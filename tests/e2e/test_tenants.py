"""Tenants that survive restarts of the real server with the key list changed: reordered,
rotated, and an upgrade of a store written under positional tenants."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from sqlalchemy import insert

from app.config import Settings
from app.main import create_app
from app.store.engines import create_engine, normalize_url, sqlite_url
from app.store.factory import SQLITE_FILE
from app.store.migrate import upgrade
from app.store.schema import responses
from tests.client import Client
from tests.conftest import scripted_backend
from tests.live import LiveServer
from tests.store.helpers import new_id, resource

QUICK = {"model": "scripted-text", "input": "hi"}


@contextmanager
def server(data_dir: Path, keys: list[str]) -> Iterator[str]:
    live = LiveServer(create_app(Settings(data_dir=data_dir, api_keys=keys), backends=[scripted_backend()])).start()
    try:
        yield live.url
    finally:
        live.stop()


def fetch(url: str, key: str, response_id: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/responses/{response_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_reordering_the_keys_keeps_each_tenants_responses(tmp_path: Path) -> None:
    with server(tmp_path, ["a-secret", "b-secret"]) as url:
        stored = Client(url, api_key="a-secret").create(**QUICK)
        assert fetch(url, "b-secret", stored["id"]).status_code == 404
    with server(tmp_path, ["b-secret", "a-secret"]) as url:
        assert fetch(url, "a-secret", stored["id"]).json() == stored
        assert fetch(url, "b-secret", stored["id"]).status_code == 404
    with server(tmp_path, ["a-secret"]) as url:  # b removed
        assert fetch(url, "a-secret", stored["id"]).json() == stored


def test_a_rotated_key_keeps_its_tenants_responses(tmp_path: Path) -> None:
    with server(tmp_path, ["alice:old-secret", "bob:b-secret"]) as url:
        stored = Client(url, api_key="old-secret").create(**QUICK)
        chained = Client(url, api_key="old-secret").create(**QUICK, previous_response_id=stored["id"])
    with server(tmp_path, ["bob:b-secret", "alice:old-secret", "alice:new-secret"]) as url:  # rotating
        assert fetch(url, "new-secret", stored["id"]).json() == stored
        assert fetch(url, "old-secret", chained["id"]).json() == chained
    with server(tmp_path, ["alice:new-secret", "bob:b-secret"]) as url:  # rotated
        assert fetch(url, "new-secret", chained["id"]).json() == chained
        assert fetch(url, "b-secret", stored["id"]).status_code == 404
        assert fetch(url, "old-secret", stored["id"]).status_code == 401
        after = Client(url, api_key="new-secret").create(**QUICK, previous_response_id=chained["id"])
        assert after["previous_response_id"] == chained["id"]


def test_a_store_of_positional_tenants_is_upgraded_at_start(tmp_path: Path) -> None:
    """Rows an earlier version wrote for ``key-0`` and ``key-1`` belong, after the first
    start with that key list, to those keys wherever they later move."""
    ids = {tenant: new_id("resp") for tenant in ("key-0", "key-1")}

    async def earlier_version() -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        engine = create_engine(normalize_url(sqlite_url(tmp_path / SQLITE_FILE)), pool_size=1)
        try:
            await upgrade(engine, target="0001")
            async with engine.begin() as connection:
                for tenant, response_id in ids.items():
                    await connection.execute(insert(responses).values(
                        id=response_id, tenant=tenant, status="completed", created_at=1_760_000_000,
                        model="scripted-text", tools=[], resource=resource(response_id, status="completed"),
                        background=False, owner="earlier-version", updated_at=0, finished_at=0,
                    ))
        finally:
            await engine.dispose()

    asyncio.run(earlier_version())
    with server(tmp_path, ["first-secret", "second-secret"]) as url:
        assert fetch(url, "first-secret", ids["key-0"]).json()["id"] == ids["key-0"]
        assert fetch(url, "second-secret", ids["key-1"]).json()["id"] == ids["key-1"]
        assert fetch(url, "first-secret", ids["key-1"]).status_code == 404
    with server(tmp_path, ["second-secret", "first-secret"]) as url:
        assert fetch(url, "first-secret", ids["key-0"]).status_code == 200
        assert fetch(url, "second-secret", ids["key-1"]).status_code == 200
        assert fetch(url, "second-secret", ids["key-0"]).status_code == 404
