"""The retention on both engines: what a pass deletes (finished responses past it, as
DELETE does), what it keeps (running ones, young ones, and the items a young visible
turn's chain still needs), and that it goes through any number of batches."""

from __future__ import annotations

import dataclasses
import time

import pytest

from app.store import retention as retention_module
from app.store.base import NewResponse
from app.store.retention import Retention
from app.store.sql import SqlResponseStore
from tests.store.helpers import assistant_message, final, new_response, row_count, user_message

pytestmark = pytest.mark.anyio

OLD = 1_760_000_000  # October 2025: past a retention of 30 days


async def finished(store: SqlResponseStore, tenant: str, *, previous: str | None = None,
                   created_at: int = OLD, text: str = "question") -> NewResponse:
    begun = dataclasses.replace(new_response(tenant, previous=previous, inputs=[user_message(text)]),
                                created_at=created_at)
    await store.begin(begun)
    output = [assistant_message(f"answer to {text}")]
    await store.finish(tenant, begun.id, final(begun, output), output, None)
    return begun


async def test_a_pass_deletes_what_is_past_the_retention_and_nothing_else(store: SqlResponseStore, tenant: str) -> None:
    an_hour_ago = int(time.time()) - 3600
    old_alone = await finished(store, tenant)
    old_parent = await finished(store, tenant, text="the old turn")
    young_child = await finished(store, tenant, previous=old_parent.id, created_at=an_hour_ago, text="the young turn")
    young = await finished(store, tenant, created_at=an_hour_ago)
    running = new_response(tenant)  # created long ago, still running: never deleted
    await store.begin(running)

    assert await Retention(store, days=30).run_once() == 2
    assert await store.get(tenant, old_alone.id) is None
    assert await store.get(tenant, old_parent.id) is None
    for kept in (young_child, young, running):
        assert await store.get(tenant, kept.id) is not None
    # the young turn's context still has the old one's items
    links = await store.chain(tenant, young_child.id)
    assert links is not None and [link.response_id for link in links] == [old_parent.id, young_child.id]
    assert links[0].input_items == old_parent.input_items
    assert await row_count(store, "items", old_alone.id) == 0

    assert await Retention(store, days=30).run_once() == 0  # a second pass finds nothing
    assert await Retention(store, days=0.01).run_once() == 2  # 14.4 minutes: the hour-old ones too
    assert await row_count(store, "items", old_parent.id) == 0  # nothing visible needs them now
    assert await store.get(tenant, running.id) is not None


async def test_a_pass_goes_through_every_batch(store: SqlResponseStore, tenant: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention_module, "BATCH", 4)
    made = [await finished(store, tenant, text=f"q{n}") for n in range(10)]
    assert await Retention(store, days=1).run_once() == 10
    assert all([await store.get(tenant, response.id) is None for response in made])


def test_how_often_a_pass_runs() -> None:
    assert Retention(None, days=30).every == 3600  # type: ignore[arg-type]
    assert Retention(None, days=0.001).every == pytest.approx(8.64)  # type: ignore[arg-type]
    assert Retention(None, days=0.000_001).every == 1  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Retention(None, days=0)  # type: ignore[arg-type]
