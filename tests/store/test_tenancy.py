"""Another tenant's response is absent: nothing is returned, counted or changed."""

from __future__ import annotations

import pytest

from app.errors import PreviousResponseNotFound
from app.store.base import StoreConflict
from app.store.sql import SqlResponseStore
from tests.store.helpers import assistant_message, events_of, final, new_response, row_count

pytestmark = pytest.mark.anyio


async def test_another_tenant_sees_nothing(store: SqlResponseStore, tenant: str) -> None:
    first = new_response(tenant)
    await store.begin(first)
    await store.finish(tenant, first.id, final(first, [assistant_message("one")]), [assistant_message("one")],
                       events_of(first.id))
    second = new_response(tenant, previous=first.id)
    await store.begin(second)
    stranger = f"other-{tenant}"

    for response_id in (first.id, second.id):
        assert await store.get(stranger, response_id) is None
        assert await store.chain(stranger, response_id) is None
        assert await store.input_items(stranger, response_id, limit=20, order="asc", after=None) is None
        assert await store.events(stranger, response_id) is None
        assert await store.delete(stranger, response_id) is False
    with pytest.raises(StoreConflict):
        await store.finish(stranger, second.id, final(second, []), [], [])
    with pytest.raises(StoreConflict):
        await store.set_status(stranger, second.id, "in_progress", second.resource)
    with pytest.raises(PreviousResponseNotFound):
        await store.begin(new_response(stranger, previous=first.id))

    # the owner's data is untouched
    stored = await store.get(tenant, second.id)
    assert stored is not None and stored.status == "in_progress"
    links = await store.chain(tenant, second.id)
    assert links is not None and [link.response_id for link in links] == [first.id, second.id]
    assert await store.events(tenant, first.id) == events_of(first.id)
    assert await row_count(store, "items", first.id) == 2
