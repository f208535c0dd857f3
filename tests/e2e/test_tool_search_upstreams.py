"""Tool search through upstreams. A Chat Completions upstream (scripted on loopback, named
as such: it answers with the calls a test asks for and records what it is sent) gets this
server's search: only the tools not deferred plus the ``tool_search`` function, the
loaded tools appended after them in the next round, never changing the list before. A
Responses upstream (a second real ors on loopback, generating with scripted models) gets
the tools as they came, ``tool_search`` and ``defer_loading`` included, runs the search
itself and its search items reach the client; with the dialect option
``native_tool_search = false`` it gets this server's search instead."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from app.backends.scripted import ScriptedBackend
from app.config import Settings
from app.main import create_app
from tests.client import Client
from tests.e2e.test_responses_upstream import Recorder
from tests.e2e.test_tool_search import CALENDAR, CLIENT_SEARCH, CRM, SHELL, TOOLS, WEATHER, finder
from tests.live import LiveServer, serve_in_front
from tests.superset import tool_search_spec
from tests.upstream_server import DONE, ScriptedUpstream, chunk, running_scripted_upstream, tool_call

BODIES: list[dict[str, Any]] = []
PEERS: list[Any] = []


@pytest.fixture(scope="module")
def chat() -> Iterator[ScriptedUpstream]:
    with running_scripted_upstream() as scripted:
        yield scripted


@pytest.fixture(scope="module")
def far(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The Responses upstream: another ors, whose scripted model searches."""
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("far"), default_model="finder"),
                     backends=[ScriptedBackend({"finder": finder})])
    app.add_middleware(Recorder, bodies=BODIES, peers=PEERS)
    server = LiveServer(app).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def front(chat: ScriptedUpstream, far: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    data = tmp_path_factory.mktemp("front")
    server = serve_in_front(data, f"""
[upstreams.chat]
base_url = "{chat.base_url}"
prefixes = ["chat/"]

[upstreams.far]
base_url = "{far.url}/v1"
wire_api = "responses"
prefixes = ["far/"]

[upstreams.emulated]
base_url = "{far.url}/v1"
wire_api = "responses"
prefixes = ["emulated/"]
[upstreams.emulated.dialect]
native_tool_search = false
""", default_model="far/finder")
    client = Client(server.url, spec=tool_search_spec())
    yield client
    client.close()
    server.stop()


def _names(tools: list[dict[str, Any]]) -> list[str]:
    return [tool.get("function", tool).get("name", tool["type"]) for tool in tools]


def _types(response: dict[str, Any]) -> list[str]:
    return [item["type"] for item in response["output"]]


# ---------------------------------------------------------------- Chat Completions


def test_a_chat_completions_upstream_gets_the_search_function_and_the_loaded_tools_last(
        front: Client, chat: ScriptedUpstream) -> None:
    model = "searching"
    chat.stream(chunk(tool_calls=[tool_call(0, id="c1", name="tool_search", arguments='{"query": "weather"}')]),
                chunk(finish_reason="tool_calls"), DONE, model=model)
    chat.stream(chunk(tool_calls=[tool_call(0, id="c2", name="get_weather", arguments='{"city": "Oslo"}')]),
                chunk(finish_reason="tool_calls"), DONE, model=model)
    chat.stream(chunk(content="Cold.", finish_reason="stop"), DONE, model=model)

    first = front.stream(model=f"chat/{model}", input="What is the weather?", tools=TOOLS).final
    assert _types(first) == ["tool_search_call", "tool_search_output", "function_call"]
    call, output, weather = first["output"]
    assert output["tools"] == [WEATHER] and output["call_id"] == call["call_id"] == "c1"
    assert weather["name"] == "get_weather"

    one, two = (request.body for request in chat.requests_for(model))
    assert _names(one["tools"]) == ["shell", "tool_search"]
    assert _names(two["tools"]) == ["shell", "tool_search", "get_weather"]
    assert two["tools"][:2] == one["tools"]  # the list before the loaded tool is the same
    assert two["messages"][:len(one["messages"])] == one["messages"]
    searched, answered = two["messages"][len(one["messages"]):]
    assert searched["tool_calls"][0]["function"]["name"] == "tool_search"
    assert (answered["role"], answered["tool_call_id"]) == ("tool", "c1")
    assert '"name": "get_weather"' in answered["content"]

    # the next turn: the chain's search still loads the tool, after the request's own
    answer = {"type": "function_call_output", "call_id": weather["call_id"], "output": "-5C"}
    second = front.create(model=f"chat/{model}", previous_response_id=first["id"], input=[answer], tools=TOOLS)
    assert second["status"] == "completed"
    three = chat.requests_for(model)[-1].body
    assert _names(three["tools"]) == ["shell", "tool_search", "get_weather"]


# ---------------------------------------------------------------- Responses


def test_a_responses_upstream_gets_the_tools_as_they_came_and_searches_itself(front: Client) -> None:
    BODIES.clear()
    first = front.create(model="far/finder", input="weather forecast", tools=TOOLS)
    [sent] = BODIES
    assert [(tool["type"], tool.get("name"), tool.get("defer_loading")) for tool in sent["tools"]] == [
        ("function", "shell", None), ("function", "get_weather", True), ("function", "crm__lookup_account", True),
        ("function", "crm__list_invoices", True), ("tool_search", None, None)]
    assert _types(first) == ["message", "tool_search_call", "tool_search_output", "function_call"]
    _, call, output, weather = first["output"]
    assert (call["execution"], call["arguments"]) == ("server", {"query": "weather forecast"})
    assert output["tools"] == [WEATHER] and output["call_id"] == call["call_id"]
    assert json.loads(weather["arguments"]) == {"city": "Paris"}

    answer = {"type": "function_call_output", "call_id": weather["call_id"], "output": "sunny"}
    second = front.create(model="far/finder", previous_response_id=first["id"], input=[answer], tools=TOOLS)
    assert second["output"][-1]["content"][0]["text"] == "Done: sunny"
    replayed = [item for item in BODIES[-1]["input"] if item["type"].startswith("tool_search")]
    assert [(item["type"], item["execution"]) for item in replayed] == [("tool_search_call", "server"),
                                                                        ("tool_search_output", "server")]
    assert replayed[0]["arguments"] == {"query": "weather forecast"}
    assert [tool["name"] for tool in replayed[1]["tools"]] == ["get_weather"]


def test_a_client_search_through_a_responses_upstream(front: Client) -> None:
    BODIES.clear()
    first = front.create(model="far/finder", input="calendar", tools=[SHELL, CLIENT_SEARCH])
    assert BODIES[-1]["tools"][-1] == CLIENT_SEARCH
    [call] = [item for item in first["output"] if item["type"] == "tool_search_call"]
    assert call["execution"] == "client" and call["call_id"]

    loaded = {"type": "tool_search_output", "call_id": call["call_id"], "execution": "client", "tools": [CALENDAR]}
    second = front.create(model="far/finder", previous_response_id=first["id"], input=[loaded],
                          tools=[SHELL, CLIENT_SEARCH])
    [made] = [item for item in second["output"] if item["type"] == "function_call"]
    assert (made["name"], made["namespace"]) == ("create_event", "mcp__calendar")
    sent = BODIES[-1]["input"][-1]
    assert (sent["type"], [tool["name"] for tool in sent["tools"]]) == ("tool_search_output",
                                                                       ["mcp__calendar__create_event"])


def test_a_responses_upstream_without_tool_search_gets_this_servers_search(front: Client) -> None:
    BODIES.clear()
    response = front.create(model="emulated/finder", input="customer account", tools=[SHELL, CRM,
                                                                                       {"type": "tool_search"}])
    one, two = BODIES
    assert _names(one["tools"]) == ["shell", "tool_search"] and all(t["type"] == "function" for t in one["tools"])
    assert _names(two["tools"]) == ["shell", "tool_search", "crm__lookup_account", "crm__list_invoices"]
    assert [item["type"] for item in two["input"][-2:]] == ["function_call", "function_call_output"]
    assert _types(response)[1:3] == ["tool_search_call", "tool_search_output"]
