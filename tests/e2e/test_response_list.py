"""``GET /v1/responses``: the tenant's stored responses, a page at a time, over real HTTP
on both store engines (SQLite and a real PostgreSQL); the WebSocket transport on the same
path stays. Responses come from the scripted backend (named as such): the listing is
the store's, whatever model made them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.config import Settings
from app.main import create_app
from compliance import check_response, validate_error_body
from tests.client import Client
from tests.conftest import scripted_backend
from tests.live import LiveServer
from tests.ws_client import MuxSocket

KEYS = ("alice-key", "bob-key")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    database_url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    settings = Settings(data_dir=tmp_path_factory.mktemp(f"list-{request.param}"), database_url=database_url,
                        default_model="scripted-text", api_keys=list(KEYS))
    live = LiveServer(create_app(settings, backends=[scripted_backend()])).start()
    yield live
    live.stop()


def created(client: Client, count: int, **body: Any) -> list[str]:
    """``count`` stored responses, oldest first, each made in a millisecond of its own
    (ids made in one millisecond have no order among them)."""
    ids = []
    for _ in range(count):
        time.sleep(0.002)
        ids.append(client.create(input="Hi", **body)["id"])
    return ids


def listed(client: Client, **query: Any) -> dict[str, Any]:
    reply = client.http.get("/v1/responses", params=query)
    assert reply.status_code == 200, reply.text
    page = reply.json()
    assert page["object"] == "list" and set(page) == {"object", "data", "first_id", "last_id", "has_more"}
    for resource in page["data"]:
        check_response(resource)
    ids = [resource["id"] for resource in page["data"]]
    assert (page["first_id"], page["last_id"]) == ((ids[0], ids[-1]) if ids else (None, None))
    return page


def all_ids(client: Client, order: str, limit: int) -> list[str]:
    seen: list[str] = []
    after = None
    while True:
        page = listed(client, order=order, limit=limit, **({"after": after} if after else {}))
        seen += [resource["id"] for resource in page["data"]]
        if not page["has_more"]:
            return seen
        after = page["last_id"]


def test_stored_responses_are_listed_newest_first_page_by_page(server: LiveServer) -> None:
    with Client(server.url, api_key=KEYS[0]) as alice, Client(server.url, api_key=KEYS[1]) as bob:
        mine = created(alice, 5)
        alice.create(input="not kept", store=False)
        theirs = created(bob, 2)
        deleted = alice.http.delete(f"/v1/responses/{mine[2]}")
        assert deleted.status_code == 200
        kept = [response_id for response_id in mine if response_id != mine[2]]
        assert all_ids(alice, "desc", 2)[:4] == kept[::-1]
        assert all_ids(alice, "asc", 3)[-4:] == kept
        assert all_ids(bob, "desc", 1)[:2] == theirs[::-1]
        assert not set(all_ids(bob, "asc", 100)) & set(mine)
        newest = listed(alice, limit=1)
        assert newest["data"][0]["id"] == kept[-1] and newest["has_more"]
        assert newest["data"][0] == alice.http.get(f"/v1/responses/{kept[-1]}").json()


def test_the_cursor_follows_the_input_items_rules(server: LiveServer) -> None:
    with Client(server.url, api_key=KEYS[0]) as alice, Client(server.url, api_key=KEYS[1]) as bob:
        mine = created(alice, 3)
        theirs = created(bob, 1)
        for after in ("resp_unknown", theirs[0]):
            page = listed(alice, after=after)
            assert page["data"] == [] and not page["has_more"]
        page = listed(alice, after=mine[2], limit=2)
        assert [resource["id"] for resource in page["data"]] == [mine[1], mine[0]]


@pytest.mark.parametrize(("query", "param"), [({"limit": 0}, "limit"), ({"limit": 101}, "limit"),
                                              ({"order": "newest"}, "order")])
def test_bad_paging_is_a_400_naming_its_parameter(server: LiveServer, query: dict[str, Any], param: str) -> None:
    with Client(server.url, api_key=KEYS[0]) as alice:
        reply = alice.http.get("/v1/responses", params=query)
    assert reply.status_code == 400
    validate_error_body(reply.json())
    assert reply.json()["error"]["param"] == param


def test_listing_needs_a_key_and_the_websocket_transport_stays_on_the_path(server: LiveServer) -> None:
    with Client(server.url) as anonymous:
        reply = anonymous.http.get("/v1/responses")
    assert reply.status_code == 401
    validate_error_body(reply.json())
    socket = MuxSocket(server.url.replace("http://", "ws://") + "/v1/responses",
                       headers={"Authorization": f"Bearer {KEYS[0]}"})
    try:
        socket.send(input="Hi")
        [turn] = socket.turns(1)
        assert turn.final["status"] == "completed"
    finally:
        socket.close()
    with Client(server.url, api_key=KEYS[0]) as alice:
        assert turn.final["id"] in all_ids(alice, "desc", 100)
