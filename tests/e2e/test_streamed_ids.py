"""The ids a client reads while a response streams are the ids it keeps: every item's
``id``, and each call's ``call_id`` (``function_call``, ``custom_tool_call``), are the
same in ``response.output_item.added``, in ``response.output_item.done``, in the
``response.completed`` response and in the stored response (``GET``), over SSE and
WebSocket, on the embedded model. Codex answers a call by the ``call_id`` it streamed,
and continues from the stored response. (The same through an upstream:
``test_responses_upstream.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.client import Client
from tests.conftest import SMOL
from tests.e2e.test_custom_tools import EDITS, SUPERSET
from tests.e2e.test_websocket import Socket
from tests.live import LiveServer

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def identities(items: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    return [(item["type"], item["id"], item.get("call_id")) for item in items]


def assert_ids_kept(events: list[dict[str, Any]], final: dict[str, Any], stored: dict[str, Any], kind: str) -> None:
    added = [event["item"] for event in events if event["type"] == "response.output_item.added"]
    done = [event["item"] for event in events if event["type"] == "response.output_item.done"]
    completed = [event["response"] for event in events if event["type"] == "response.completed"]
    assert completed and completed[0]["id"] == final["id"] == stored["id"]
    streamed = identities(added)
    assert streamed == identities(done) == identities(completed[0]["output"]) == identities(stored["output"])
    calls = [identity for identity in streamed if identity[0] == kind]
    assert calls and all(call_id for _, _, call_id in calls), streamed
    for event in events:
        if "item_id" in event:
            assert event["item_id"] in {identity[1] for identity in streamed}


@pytest.fixture(scope="module")
def custom(server: LiveServer) -> Iterator[Client]:
    client = Client(server.url, spec=SUPERSET)
    yield client
    client.close()


@pytest.mark.parametrize(("tool", "choice", "kind"), [
    (WEATHER, {"type": "function", "name": "get_weather"}, "function_call"),
    (EDITS, {"type": "custom", "name": "edit_files"}, "custom_tool_call"),
])
def test_over_sse_on_the_embedded_model(custom: Client, tool: dict[str, Any], choice: dict[str, Any],
                                        kind: str) -> None:
    result = custom.stream(model=SMOL, input="Paris, and notes.txt.", tools=[tool], tool_choice=choice,
                           max_output_tokens=200)
    stored = custom.http.get(f"/v1/responses/{result.final['id']}").json()
    assert_ids_kept(result.events, result.final, stored, kind)


def test_over_websocket_on_the_embedded_model(server: LiveServer, client: Client) -> None:
    socket = Socket(server.url.replace("http://", "ws://") + "/v1/responses")
    try:
        socket.send(model=SMOL, input="Weather in Paris?", tools=[WEATHER],
                    tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=120)
        events, final = socket.turn(timeout=300)
    finally:
        socket.close()
    stored = client.http.get(f"/v1/responses/{final['id']}").json()
    assert_ids_kept(events, final, stored, "function_call")
