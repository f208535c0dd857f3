"""Conversation state over real HTTP, on both store engines (SQLite and a real
PostgreSQL): ``previous_response_id`` chains, ``store``, the lifecycle endpoints,
truncation and tenancy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.backends.local import LocalBackend
from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.main import create_app
from compliance import check_response, check_sse_body, validate_error_body
from tests.client import Client
from tests.conftest import SMOL, scripted_backend
from tests.live import LiveServer
from tests.recording import RecordingBackend

KEYS = ("alice-key", "bob-key")


@dataclass
class Stateful:
    server: LiveServer
    model: RecordingBackend
    scripted: ScriptedBackend
    alice: Client
    bob: Client


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def stateful(request: pytest.FixtureRequest, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stateful]:
    database_url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    settings = Settings(
        default_model=SMOL,
        data_dir=tmp_path_factory.mktemp(f"state-{request.param}"),
        database_url=database_url,
        api_keys=list(KEYS),
    )
    model = RecordingBackend(LocalBackend(model_dir, n_threads=2, n_ctx=4096, preload=[SMOL], models=[SMOL]))
    scripted = scripted_backend()
    server = LiveServer(create_app(settings, backends=[model, scripted])).start()
    alice, bob = Client(server.url, api_key=KEYS[0]), Client(server.url, api_key=KEYS[1])
    yield Stateful(server, model, scripted, alice, bob)
    alice.close()
    bob.close()
    server.stop()


def test_three_turn_chain_reaches_the_model_in_order(stateful: Stateful) -> None:
    client = stateful.alice
    first = client.create(model=SMOL, input="My secret code word is PELICAN.", instructions="Be brief.",
                          max_output_tokens=16)
    second = client.create(model=SMOL, input="What is 2+2?", previous_response_id=first["id"],
                           max_output_tokens=16)
    third = client.stream(model=SMOL, input="Repeat my secret code word.", previous_response_id=second["id"],
                          max_output_tokens=16).final
    assert third["previous_response_id"] == second["id"]
    conversation = stateful.model.last_conversation()
    roles = [role for role, _ in conversation]
    assert roles == ["user", "assistant", "user", "assistant", "user"]  # instructions not inherited
    assert "PELICAN" in conversation[0][1]
    assert conversation[1][1] == _text(first) and conversation[3][1] == _text(second)
    assert conversation[4][1] == "Repeat my secret code word."


def _text(response: dict) -> str:  # type: ignore[type-arg]
    return "".join(p["text"] for i in response["output"] if i["type"] == "message" for p in i["content"])


def test_store_false_is_never_persisted(stateful: Stateful) -> None:
    client = stateful.alice
    response = client.create(model="scripted-text", input="x", store=False)
    assert response["store"] is False
    assert client.http.get(f"/v1/responses/{response['id']}").status_code == 404
    error = client.error({"model": "scripted-text", "input": "y", "previous_response_id": response["id"]}, 400)
    assert (error["code"], error["param"]) == ("previous_response_not_found", "previous_response_id")


def test_unknown_previous_response_fails_before_the_stream(stateful: Stateful) -> None:
    error = stateful.alice.error(
        {"model": "scripted-text", "input": "y", "previous_response_id": "resp_unknown", "stream": True}, 400
    )
    assert error["code"] == "previous_response_not_found"


def test_retrieve_returns_the_final_response(stateful: Stateful) -> None:
    client = stateful.alice
    created = client.create(model="scripted-text", input="x", metadata={"k": "v"})
    fetched = client.http.get(f"/v1/responses/{created['id']}")
    assert fetched.status_code == 200
    assert check_response(fetched.json()) == created


def test_replay_stored_events(stateful: Stateful) -> None:
    client = stateful.alice
    streamed = client.stream(model="scripted-text", input="x")
    response_id = streamed.final["id"]
    replay = client.http.get(f"/v1/responses/{response_id}", params={"stream": "true"})
    assert check_sse_body(replay.content) == streamed.final
    assert replay.content == streamed.raw.replace(b": ping\n\n", b"")
    tail = client.http.get(f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": 5})
    numbers = [int(line.split(b'"sequence_number":')[1].split(b",")[0])
               for line in tail.content.splitlines() if line.startswith(b"data: {")]
    assert numbers[0] == 6 and numbers[-1] == streamed.events[-1]["sequence_number"]


def test_a_plain_json_answer_keeps_no_events_to_replay(stateful: Stateful) -> None:
    """Only streamed and background responses keep their events (a JSON answer has no
    stream to resume; OpenAI's API replays background responses only): the replay of a
    JSON answer is a 400 that says why, and the response itself is all there."""
    client = stateful.alice
    created = client.create(model="scripted-text", input="x")
    replay = client.http.get(f"/v1/responses/{created['id']}", params={"stream": "true"})
    assert replay.status_code == 400, replay.text
    validate_error_body(replay.json())
    error = replay.json()["error"]
    assert error["code"] == "events_unavailable" and error["param"] == "stream"
    assert "plain JSON" in error["message"]
    assert check_response(client.http.get(f"/v1/responses/{created['id']}").json()) == created
    assert client.create(model="scripted-text", input="y", previous_response_id=created["id"])["status"] == "completed"


def stored_row(stateful: Stateful, response_id: str) -> dict[str, object]:
    """The response's row as the database holds it, read on a connection of its own."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    url = stateful.server.server.config.app.state.engine.store.url

    async def read() -> dict[str, object]:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as connection:
                row = (await connection.execute(text("SELECT * FROM responses WHERE id = :id"),
                                                {"id": response_id})).one()
                return dict(row._mapping)
        finally:
            await engine.dispose()

    return asyncio.run(read())


def test_delete_then_cannot_fetch_or_continue(stateful: Stateful) -> None:
    client = stateful.alice
    response = client.create(model="scripted-text", input="x", instructions="Keep this secret: OSPREY.")
    assert "OSPREY" in str(stored_row(stateful, response["id"]))
    deleted = client.http.delete(f"/v1/responses/{response['id']}")
    assert deleted.json() == {"id": response["id"], "object": "response.deleted", "deleted": True}
    # the row stays, hidden, without the content: deleted means deleted
    row = stored_row(stateful, response["id"])
    assert "OSPREY" not in str(row) and "Hello" not in str(row) and row["deleted_at"] is not None
    assert client.http.get(f"/v1/responses/{response['id']}").status_code == 404
    assert client.http.delete(f"/v1/responses/{response['id']}").status_code == 404
    error = client.error({"model": "scripted-text", "input": "y", "previous_response_id": response["id"]}, 400)
    assert error["code"] == "previous_response_not_found"


def test_deleting_a_middle_link_keeps_later_turns_whole(stateful: Stateful) -> None:
    client = stateful.alice
    first = client.create(model="scripted-text", input="first words")
    second = client.create(model="scripted-text", input="second words", previous_response_id=first["id"])
    assert client.http.delete(f"/v1/responses/{first['id']}").status_code == 200
    client.create(model="scripted-text", input="third words", previous_response_id=second["id"])
    contents = [m.content for m in stateful.scripted.requests[-1].messages]
    assert contents[0] == "first words" and contents[-1] == "third words"


def test_other_tenants_see_nothing(stateful: Stateful) -> None:
    mine = stateful.alice.create(model="scripted-text", input="x")
    bob = stateful.bob
    assert bob.http.get(f"/v1/responses/{mine['id']}").status_code == 404
    assert bob.http.get(f"/v1/responses/{mine['id']}/input_items").status_code == 404
    assert bob.http.delete(f"/v1/responses/{mine['id']}").status_code == 404
    assert bob.http.post(f"/v1/responses/{mine['id']}/cancel").status_code == 404
    error = bob.error({"model": "scripted-text", "input": "y", "previous_response_id": mine["id"]}, 400)
    assert error["code"] == "previous_response_not_found"
    assert stateful.alice.http.get(f"/v1/responses/{mine['id']}").status_code == 200


def test_requests_without_a_key_are_refused(stateful: Stateful) -> None:
    reply = httpx.post(f"{stateful.server.url}/v1/responses", json={"input": "x"})
    assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"


def test_input_items_pagination(stateful: Stateful) -> None:
    client = stateful.alice
    items = [{"role": "user", "content": f"message {n}"} for n in range(5)]
    response = client.create(model="scripted-text", input=items)
    path = f"/v1/responses/{response['id']}/input_items"

    def page(**params: object) -> dict:  # type: ignore[type-arg]
        reply = client.http.get(path, params=params)
        assert reply.status_code == 200, reply.text
        return reply.json()  # type: ignore[no-any-return]

    everything = page(order="asc", limit=100)
    texts = [item["content"][0]["text"] for item in everything["data"]]
    assert texts == [f"message {n}" for n in range(5)] and everything["has_more"] is False
    assert everything["object"] == "list"
    assert everything["first_id"] == everything["data"][0]["id"]
    assert everything["last_id"] == everything["data"][-1]["id"]
    newest_first = page()
    assert [item["id"] for item in newest_first["data"]] == [item["id"] for item in everything["data"]][::-1]
    first_two = page(order="asc", limit=2)
    assert len(first_two["data"]) == 2 and first_two["has_more"] is True
    next_three = page(order="asc", limit=3, after=first_two["last_id"])
    assert [i["id"] for i in first_two["data"] + next_three["data"]] == [i["id"] for i in everything["data"]]
    assert next_three["has_more"] is False
    one = page(order="asc", limit=1, after=everything["data"][-2]["id"])
    assert len(one["data"]) == 1 and one["has_more"] is False
    for bad in ({"limit": 0}, {"limit": 101}, {"order": "sideways"}):
        reply = client.http.get(path, params=bad)
        assert reply.status_code == 400 and reply.json()["error"]["param"] in ("limit", "order")
    assert client.http.get("/v1/responses/resp_missing/input_items").status_code == 404


def test_background_response_and_cancel(stateful: Stateful) -> None:
    client = stateful.alice
    queued = client.http.post("/v1/responses", json={"model": "scripted-slow", "input": "x", "background": True})
    assert queued.status_code == 200
    body = check_response(queued.json())
    assert body["background"] is True and body["status"] in ("queued", "in_progress")
    deadline = time.monotonic() + 60  # a bound, not a measurement: scripted-slow runs for 20 s
    while (running := client.http.get(f"/v1/responses/{body['id']}").json())["status"] == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert running["status"] == "in_progress"
    cancelled = client.http.post(f"/v1/responses/{body['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert client.http.get(f"/v1/responses/{body['id']}").json()["status"] == "cancelled"
    again = client.http.post(f"/v1/responses/{body['id']}/cancel")
    assert again.json()["status"] == "cancelled"


def test_background_response_runs_to_completion(stateful: Stateful) -> None:
    client = stateful.alice
    body = client.http.post("/v1/responses", json={"model": "scripted-text", "input": "x", "background": True}).json()
    deadline = time.monotonic() + 60  # a bound, not a measurement
    while client.http.get(f"/v1/responses/{body['id']}").json()["status"] != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    replay = client.http.get(f"/v1/responses/{body['id']}", params={"stream": "true"})
    types = [line[7:] for line in replay.text.splitlines() if line.startswith("event: ")]
    assert types[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert check_sse_body(replay.content)["status"] == "completed"


def test_cancel_needs_a_background_response(stateful: Stateful) -> None:
    response = stateful.alice.create(model="scripted-text", input="x")
    reply = stateful.alice.http.post(f"/v1/responses/{response['id']}/cancel")
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "not_background"


def test_background_requires_store(stateful: Stateful) -> None:
    error = stateful.alice.error({"model": "scripted-text", "input": "x", "background": True, "store": False}, 400)
    assert error["param"] == "background"


def test_truncation_disabled_fails_on_overflow(stateful: Stateful) -> None:
    long_text = "word " * 5000
    error = stateful.alice.error({"model": SMOL, "input": long_text}, 400)
    assert (error["code"], error["param"]) == ("context_length_exceeded", "input")


def test_truncation_auto_drops_the_oldest_turns(stateful: Stateful) -> None:
    filler = "filler " * 1200
    turns = []
    for n in range(4):
        turns += [{"role": "user", "content": f"turn {n}: {filler}"}, {"role": "assistant", "content": "ok"}]
    turns.append({"role": "user", "content": "the last question"})
    response = stateful.alice.create(
        model=SMOL, input=[{"role": "system", "content": "be brief"}, *turns], truncation="auto",
        max_output_tokens=16,
    )
    assert response["truncation"] == "auto"
    conversation = stateful.model.last_conversation()
    assert conversation[0] == ("system", "be brief")
    assert conversation[-1] == ("user", "the last question")
    assert not any(content.startswith("turn 0:") for _, content in conversation)
    assert len(conversation) < len(turns) + 1
