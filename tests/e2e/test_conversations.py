"""OpenAI's Conversations API over real HTTP, on both store engines (SQLite and a real
PostgreSQL), driven by the openai SDK as its users drive it, and by hand for what the
SDK does not send (malformed bodies, other tenants). No model is called."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import NotFoundError, OpenAI

from app.config import Settings
from app.main import create_app
from compliance import validate_error_body
from tests.conftest import scripted_backend
from tests.live import LiveServer

KEYS = ("alice-key", "bob-key")
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
       "AAAABJRU5ErkJggg==")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    database_url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    settings = Settings(data_dir=tmp_path_factory.mktemp(f"conversations-{request.param}"),
                        database_url=database_url, default_model="scripted-text", api_keys=list(KEYS))
    live = LiveServer(create_app(settings, backends=[scripted_backend()])).start()
    yield live
    live.stop()


@pytest.fixture()
def alice(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key=KEYS[0], max_retries=0)


def refused(server: LiveServer, method: str, path: str, status: int, body: Any = None,
            key: str = KEYS[0]) -> dict[str, Any]:
    reply = httpx.request(method, f"{server.url}{path}", json=body, headers={"Authorization": f"Bearer {key}"})
    assert reply.status_code == status, reply.text
    validate_error_body(reply.json())
    return reply.json()["error"]  # type: ignore[no-any-return]


def test_a_conversation_is_created_read_updated_and_deleted(alice: OpenAI) -> None:
    before = int(time.time())
    conversation = alice.conversations.create(metadata={"topic": "demo"}, items=[
        {"type": "message", "role": "user", "content": "Hello!"},
        {"type": "message", "role": "assistant", "content": "Hi, how can I help?"},
    ])
    assert conversation.id.startswith("conv_") and conversation.object == "conversation"
    assert conversation.metadata == {"topic": "demo"} and conversation.created_at >= before
    assert alice.conversations.retrieve(conversation.id) == conversation
    updated = alice.conversations.update(conversation.id, metadata={"topic": "changed", "n": "2"})
    assert updated.metadata == {"topic": "changed", "n": "2"} and updated.id == conversation.id
    items = alice.conversations.items.list(conversation.id, order="asc")
    assert [(item.type, item.role) for item in items.data] == [("message", "user"), ("message", "assistant")]
    assert items.data[0].content[0].text == "Hello!"
    deleted = alice.conversations.delete(conversation.id)
    assert deleted.deleted and deleted.id == conversation.id
    with pytest.raises(NotFoundError):
        alice.conversations.retrieve(conversation.id)
    with pytest.raises(NotFoundError):
        alice.conversations.items.list(conversation.id)


def test_items_are_added_listed_page_by_page_read_and_removed(alice: OpenAI) -> None:
    conversation = alice.conversations.create()
    added = alice.conversations.items.create(conversation.id, items=[
        {"type": "message", "role": "user", "content": f"message {n}"} for n in range(5)])
    ids = [item.id for item in added.data]
    assert len(set(ids)) == 5 and not added.has_more
    more = alice.conversations.items.create(conversation.id, items=[
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
        {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": PNG}]}])
    ids += [item.id for item in more.data]
    newest_first = [item.id for item in alice.conversations.items.list(conversation.id, limit=3)]  # the SDK pages
    assert newest_first == ids[::-1]
    first_page = alice.conversations.items.list(conversation.id, limit=3, order="asc")
    assert [item.id for item in first_page.data] == ids[:3] and first_page.has_more
    after = alice.conversations.items.list(conversation.id, limit=3, order="asc", after=ids[2])
    assert [item.id for item in after.data] == ids[3:6]
    one = alice.conversations.items.retrieve(ids[6], conversation_id=conversation.id)
    assert one.type == "function_call_output" and one.output == "18 C"
    left = alice.conversations.items.delete(ids[0], conversation_id=conversation.id)
    assert left.id == conversation.id and left.object == "conversation"
    assert [item.id for item in alice.conversations.items.list(conversation.id, order="asc")] == ids[1:]
    with pytest.raises(NotFoundError):
        alice.conversations.items.retrieve(ids[0], conversation_id=conversation.id)


def test_another_tenant_sees_none_of_it(server: LiveServer, alice: OpenAI) -> None:
    conversation = alice.conversations.create(items=[{"type": "message", "role": "user", "content": "mine"}])
    item_id = alice.conversations.items.list(conversation.id).data[0].id
    for method, path, body in (
        ("GET", f"/v1/conversations/{conversation.id}", None),
        ("POST", f"/v1/conversations/{conversation.id}", {"metadata": {}}),
        ("GET", f"/v1/conversations/{conversation.id}/items", None),
        ("POST", f"/v1/conversations/{conversation.id}/items", {"items": [{"role": "user", "content": "x"}]}),
        ("GET", f"/v1/conversations/{conversation.id}/items/{item_id}", None),
        ("DELETE", f"/v1/conversations/{conversation.id}/items/{item_id}", None),
        ("DELETE", f"/v1/conversations/{conversation.id}", None),
    ):
        error = refused(server, method, path, 404, body, key=KEYS[1])
        assert error["code"] == "conversation_not_found" and error["param"] == "conversation_id"
    assert [item.id for item in alice.conversations.items.list(conversation.id)] == [item_id]


@pytest.mark.parametrize(("body", "param"), [
    ({"items": [{"type": "message", "role": "user", "content": "x"}] * 21}, "items"),
    ({"items": [{"type": "message", "role": "wizard", "content": "x"}]}, "items[0].role"),
    ({"items": [{"type": "compaction_trigger"}]}, "items[0].type"),
    ({"items": [{"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}, "items[0].content[0].image_url"),
    ({"metadata": {f"k{n}": "v" for n in range(17)}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata.k"),
    ({"metadata": "topic"}, "metadata"),
])
def test_a_malformed_conversation_is_a_400_naming_the_field(server: LiveServer, body: dict[str, Any],
                                                           param: str) -> None:
    error = refused(server, "POST", "/v1/conversations", 400, body)
    assert error["param"] == param, error


def test_adding_items_is_checked_too(server: LiveServer, alice: OpenAI) -> None:
    conversation = alice.conversations.create(items=[{"type": "message", "role": "user", "content": "hi",
                                                      "id": "msg_fixed"}])
    path = f"/v1/conversations/{conversation.id}/items"
    assert refused(server, "POST", path, 400, {"items": []})["param"] == "items"
    duplicate = refused(server, "POST", path, 400, {"items": [{"type": "message", "role": "user", "content": "again",
                                                               "id": "msg_fixed"}]})
    assert duplicate["code"] == "duplicate_item" and duplicate["param"] == "items[0].id"
    assert refused(server, "GET", f"{path}?limit=0", 400)["param"] == "limit"
    assert refused(server, "GET", f"{path}?order=sideways", 400)["param"] == "order"
    missing = refused(server, "GET", f"{path}/msg_absent", 404)
    assert missing["code"] == "item_not_found" and missing["param"] == "item_id"
    assert refused(server, "POST", f"/v1/conversations/{conversation.id}", 400, {})["param"] == "metadata"
    assert [item.id for item in alice.conversations.items.list(conversation.id)] == ["msg_fixed"]
