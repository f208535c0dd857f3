"""Tool search (OpenAI's ``tool_search`` tool and ``defer_loading``) end to end over HTTP
and WebSocket: deferred tools are hidden from the model, which is offered a
``tool_search`` function; a server-run search is run here and the response goes on with
the loaded tools; a client-run search is a ``tool_search_call`` the client answers with a
``tool_search_output``. The scripted models (named as such) search and call on demand and
record what they were shown. Every response and event is judged by the vendored spec with
exactly the two tool search items added (``tests.superset``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.backends.base import Delta, Finish, GenerationRequest, TextDelta, ToolCallDelta, Usage
from app.backends.model_files import LOCAL_MODELS, ModelFiles
from app.backends.scripted import ScriptedBackend
from app.backends.vocabulary import Vocabulary
from app.config import Settings
from app.main import create_app
from compliance import StreamChecker
from tests.client import Client
from tests.conftest import SMOL
from tests.e2e.test_websocket import Socket
from tests.live import LiveServer
from tests.superset import tool_search_spec

SHELL = {"type": "function", "name": "shell", "description": "Run a command.",
         "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather forecast for a city.",
           "defer_loading": True, "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}},
                          "required": ["city"], "additionalProperties": False}}
LOOKUP = {"type": "function", "name": "lookup_account", "description": "Find a customer account by name.",
          "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}
INVOICES = {"type": "function", "name": "list_invoices", "description": "List the invoices of an account.",
            "parameters": {"type": "object", "properties": {"account_id": {"type": "string"}}}}
CRM = {"type": "namespace", "name": "crm", "description": "Customer records: accounts and invoices.",
       "defer_loading": True, "tools": [LOOKUP, INVOICES]}
SEARCH = {"type": "tool_search"}
TOOLS = [SHELL, WEATHER, CRM, SEARCH]
ARGUMENTS = {"get_weather": '{"city": "Paris"}', "crm__lookup_account": '{"name": "Acme"}'}


def _text(text: str) -> list[Delta]:
    return [TextDelta(text), Finish("stop", Usage(3, 2))]


def finder(request: GenerationRequest) -> list[Delta]:
    """Searches for the last user message, calls the first tool the search loaded, and
    answers with that tool's output."""
    last = request.messages[-1]
    if last.role == "tool" and last.loaded is None:
        return _text(f"Done: {last.content}")
    if last.role == "tool":
        if not last.loaded.tools:
            return _text("Nothing found.")
        name = last.loaded.tools[0].name
        return [ToolCallDelta(0, name=name, arguments=ARGUMENTS.get(name, "{}")), Finish("tool_calls", Usage(9, 4))]
    query = next(m.content for m in reversed(request.messages) if m.role == "user")
    return [TextDelta("Let me look."), ToolCallDelta(0, name="tool_search", arguments=json.dumps({"query": query})),
            Finish("tool_calls", Usage(7, 5))]


def greedy(request: GenerationRequest) -> list[Delta]:
    """Searches, whatever it was shown."""
    return [ToolCallDelta(0, name="tool_search", arguments='{"query": "weather"}'), Finish("tool_calls")]


def searches_and_calls(request: GenerationRequest) -> list[Delta]:
    """Searches and calls the shell in one turn."""
    if request.messages[-1].role == "tool":
        return _text("Both done.")
    return [ToolCallDelta(0, name="tool_search", arguments='{"query": "weather"}'),
            ToolCallDelta(1, name="shell", arguments='{"command": "ls"}'), Finish("tool_calls")]


SCRIPTED = ScriptedBackend({"finder": finder, "greedy": greedy, "searches-and-calls": searches_and_calls})


@pytest.fixture(scope="module")
def search_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("tool-search"), default_model="finder",
                        tool_search_results=2)
    server = LiveServer(create_app(settings, backends=[SCRIPTED])).start()
    yield server
    server.stop()


@pytest.fixture()
def client(search_server: LiveServer) -> Iterator[Client]:
    client = Client(search_server.url, spec=tool_search_spec())
    yield client
    client.close()


def _of(response: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == kind]


def _rounds(count: int) -> list[GenerationRequest]:
    return SCRIPTED.requests[-count:]


# ---------------------------------------------------------------- a search run here


def test_deferred_tools_are_hidden_and_a_search_function_offered(client: Client) -> None:
    client.create(input="weather forecast", tools=TOOLS)
    first, _ = _rounds(2)
    [shell, search] = first.tools
    assert (shell.name, search.name) == ("shell", "tool_search")
    assert "get_weather: Get the current weather forecast" in search.description
    assert "crm: Customer records" in search.description  # a namespace is listed by its own description
    assert search.parameters["required"] == ["query"]
    assert first.late_tools == () and first.tool_search is None


def test_a_search_run_here_loads_tools_and_the_response_goes_on(client: Client) -> None:
    response = client.create(input="weather forecast", tools=TOOLS)

    message, call, output, weather = response["output"]
    assert output_text_of(message) == "Let me look."
    assert (call["type"], call["execution"], call["arguments"]) == ("tool_search_call", "server",
                                                                    {"query": "weather forecast"})
    assert call["id"].startswith("tsc_") and output["id"].startswith("tso_")
    assert (output["type"], output["execution"], output["call_id"]) == ("tool_search_output", "server",
                                                                        call["call_id"])
    assert output["tools"] == [WEATHER]  # as the request defined it
    assert (weather["type"], weather["name"], json.loads(weather["arguments"])) == (
        "function_call", "get_weather", {"city": "Paris"})
    assert response["usage"]["input_tokens"] > 7  # both rounds counted
    assert [tool["name"] for tool in response["tools"]] == ["shell", "get_weather", "lookup_account",
                                                            "list_invoices"]


def test_the_loaded_tools_come_at_the_end_of_the_context(client: Client) -> None:
    """The second round is the first one's prompt, unchanged, and then the model's turn
    and the search's answer: the tools shown with the prompt are the same, the loaded
    one is added after them."""
    client.create(input="weather forecast", tools=TOOLS, instructions="Be brief.")
    first, second = _rounds(2)
    assert second.tools == first.tools
    assert second.messages[:len(first.messages)] == first.messages
    turn, answer = second.messages[len(first.messages):]
    assert (turn.role, turn.content, turn.tool_calls[0].name) == ("assistant", "Let me look.", "tool_search")
    assert (answer.role, answer.tool_call_id) == ("tool", turn.tool_calls[0].call_id)
    assert '"name": "get_weather"' in answer.content and "The city." in answer.content
    assert [tool.name for tool in second.late_tools] == ["get_weather"]


def test_a_search_loads_a_namespace_with_the_functions_found(client: Client) -> None:
    response = client.create(input="customer account", tools=TOOLS)
    [output] = _of(response, "tool_search_output")
    assert output["tools"] == [{**{k: v for k, v in CRM.items() if k != "tools"}, "tools": [LOOKUP, INVOICES]}]
    [call] = _of(response, "function_call")
    assert (call["name"], call["namespace"]) == ("lookup_account", "crm")


def test_a_search_that_finds_nothing_loads_nothing(client: Client) -> None:
    response = client.create(input="quantum teleportation", tools=TOOLS)
    [output] = _of(response, "tool_search_output")
    assert output["tools"] == []
    assert output_text_of(response["output"][-1]) == "Nothing found."


def test_a_search_loads_at_most_the_configured_number(client: Client) -> None:
    many = [{**WEATHER, "name": f"weather_{n}"} for n in range(5)]
    response = client.create(input="weather", tools=[*many, SEARCH])
    [output] = _of(response, "tool_search_output")
    assert [tool["name"] for tool in output["tools"]] == ["weather_0", "weather_1"]  # ORS_TOOL_SEARCH_RESULTS=2


def test_searches_stop_after_the_configured_rounds(client: Client) -> None:
    response = client.create(model="greedy", input="weather", tools=TOOLS)
    assert response["status"] == "completed"
    assert [item["type"] for item in response["output"]] == ["tool_search_call", "tool_search_output"] * 3


def test_a_search_beside_another_call_ends_the_response(client: Client) -> None:
    response = client.create(model="searches-and-calls", input="weather", tools=TOOLS)
    assert [item["type"] for item in response["output"]] == ["function_call", "tool_search_call",
                                                             "tool_search_output"]
    assert response["output"][0]["name"] == "shell"


def test_a_streamed_search_has_its_item_events(client: Client) -> None:
    result = client.stream(input="weather forecast", tools=TOOLS)
    items = [(event["type"], event["item"]["type"], event["item"]["status"]) for event in result.events
             if event["type"].startswith("response.output_item.")]
    assert items[2:6] == [
        ("response.output_item.added", "tool_search_call", "in_progress"),
        ("response.output_item.done", "tool_search_call", "completed"),
        ("response.output_item.added", "tool_search_output", "in_progress"),
        ("response.output_item.done", "tool_search_output", "completed"),
    ]
    assert [item["type"] for item in result.final["output"]] == ["message", "tool_search_call",
                                                                 "tool_search_output", "function_call"]


def test_a_search_over_websocket(search_server: LiveServer) -> None:
    socket = Socket(search_server.url.replace("http://", "ws://") + "/v1/responses")
    try:
        socket.send(input="weather forecast", tools=TOOLS)
        checker = StreamChecker(transport="websocket", spec=tool_search_spec())
        while not checker.final_response:
            checker.feed(json.loads(socket.ws.recv(timeout=60)))
        final = checker.finish()
    finally:
        socket.close()
    assert [item["type"] for item in final["output"]][1:3] == ["tool_search_call", "tool_search_output"]


def test_a_search_is_stored_and_its_tools_stay_loaded(client: Client) -> None:
    first = client.create(input="weather forecast", tools=TOOLS)
    call = _of(first, "function_call")[0]
    fetched = client.http.get(f"/v1/responses/{first['id']}").json()
    assert fetched["output"] == first["output"]

    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    second = client.create(previous_response_id=first["id"], input=[answer], tools=TOOLS)
    assert output_text_of(second["output"][-1]) == "Done: sunny"
    seen = SCRIPTED.requests[-1]
    assert [tool.name for tool in seen.late_tools] == ["get_weather"]  # loaded by the chain's output
    assert [m.role for m in seen.messages][-5:] == ["user", "assistant", "tool", "assistant", "tool"]

    # the gate holds an answer to a loaded tool's call to that tool's schema
    bad_call = {**call, "call_id": "call_bad", "arguments": '{"town": "Paris"}'}
    error = client.error({"previous_response_id": first["id"], "tools": TOOLS, "input": [
        bad_call, {"type": "function_call_output", "call_id": "call_bad", "output": "?"}]}, 400)
    assert (error["code"], error["param"]) == ("arguments_schema", "input[1]")


def test_search_items_sent_back_as_input_are_listed(client: Client) -> None:
    first = client.create(input="weather forecast", tools=TOOLS, store=False)
    replay = [{"role": "user", "content": "weather forecast"}, *first["output"]]
    call = _of(first, "function_call")[0]
    replay.append({"type": "function_call_output", "call_id": call["call_id"], "output": "rain"})
    second = client.create(input=replay, tools=TOOLS)
    assert output_text_of(second["output"][-1]) == "Done: rain"
    listed = client.http.get(f"/v1/responses/{second['id']}/input_items", params={"order": "asc"}).json()["data"]
    assert [item["type"] for item in listed] == ["message", "message", "tool_search_call", "tool_search_output",
                                                 "function_call", "function_call_output"]
    assert listed[3]["tools"] == [WEATHER] and listed[3]["call_id"] == listed[2]["call_id"]


@pytest.mark.model
def test_the_second_rounds_prompt_extends_the_first(client: Client, model_dir: Path) -> None:
    """Rendered by SmolLM2's own chat template, the prompt of the round after a search is
    the first round's prompt, character for character, and then more: the loaded tool
    changes nothing before it, so the model's cached prefix is used again."""
    client.create(input="weather forecast", tools=TOOLS, instructions="Be brief.")
    first, second = _rounds(2)
    vocabulary = Vocabulary(LOCAL_MODELS[SMOL], ModelFiles(model_dir).path(SMOL))
    try:
        before, after = (vocabulary.prompt(round.messages, round.tools) for round in (first, second))
    finally:
        vocabulary.close()
    assert after.startswith(before) and len(after) > len(before)
    assert '"name": "get_weather"' not in before and '"name": "get_weather"' in after[len(before):]


def test_the_embedded_model_searches_and_goes_on(server: LiveServer) -> None:
    """SmolLM2 made to search (``allowed_tools``, mode ``required``: the search is all it
    can call until it has loaded something): the search runs here, its items stream,
    and the model gets a second round in the same response, whose prompt begins with
    the first round's: llama-server reuses all of it (the response's cached tokens are at
    least the first round's prompt, which nothing before this test shared)."""
    client = Client(server.url, spec=tool_search_spec())
    body = {"model": SMOL, "input": "Find the weather tool and get the weather in Paris.", "tools": [WEATHER, SEARCH],
            "tool_choice": {"type": "allowed_tools", "mode": "required",
                            "tools": [{"type": "function", "name": "tool_search"},
                                      {"type": "function", "name": "get_weather"}]},
            "temperature": 0, "max_output_tokens": 96}
    first_round = client.http.post("/v1/responses/input_tokens", json=body).json()["input_tokens"]
    result = client.stream(**body)
    final = result.final
    call, output, *rest = final["output"]
    assert (call["type"], call["execution"], output["type"]) == ("tool_search_call", "server", "tool_search_output")
    assert output["call_id"] == call["call_id"] and isinstance(call["arguments"], dict)
    assert final["status"] in ("completed", "incomplete")
    assert final["usage"]["input_tokens"] > first_round
    assert final["usage"]["input_tokens_details"]["cached_tokens"] >= first_round - 1
    client.close()


# ---------------------------------------------------------------- a search the client runs

CLIENT_SEARCH = {"type": "tool_search", "execution": "client", "description": "Find tools by a query.",
                 "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                                 "limit": {"type": "number"}},
                                "required": ["query"], "additionalProperties": False}}
CALENDAR = {"type": "namespace", "name": "mcp__calendar", "description": "Plan events.", "tools": [
    {"type": "function", "name": "create_event", "description": "Create an event.", "defer_loading": True,
     "strict": False, "parameters": {"type": "object", "properties": {"title": {"type": "string"}}}}]}


def test_a_client_search_is_a_call_the_client_answers(client: Client) -> None:
    first = client.create(input="calendar create", tools=[SHELL, CLIENT_SEARCH])
    seen = SCRIPTED.requests[-1]
    search = seen.tools[-1]
    assert (search.name, search.description, search.parameters) == (
        "tool_search", "Find tools by a query.", CLIENT_SEARCH["parameters"])
    message, call = first["output"]
    assert (call["type"], call["execution"], call["arguments"]) == ("tool_search_call", "client",
                                                                    {"query": "calendar create"})
    assert call["call_id"] and first["status"] == "completed"

    loaded = {"type": "tool_search_output", "call_id": call["call_id"], "execution": "client", "tools": [CALENDAR]}
    second = client.create(previous_response_id=first["id"], input=[loaded], tools=[SHELL, CLIENT_SEARCH])
    seen = SCRIPTED.requests[-1]
    assert [tool.name for tool in seen.tools] == ["shell", "tool_search"]  # the prompt's tools never change
    assert [tool.name for tool in seen.late_tools] == ["mcp__calendar__create_event"]
    assert "create_event" in seen.messages[-1].content
    [made] = _of(second, "function_call")
    assert (made["name"], made["namespace"]) == ("create_event", "mcp__calendar")
    listed = client.http.get(f"/v1/responses/{second['id']}/input_items").json()["data"]
    assert listed[0]["type"] == "tool_search_output" and listed[0]["tools"] == [CALENDAR]


def test_a_client_search_replayed_whole(client: Client) -> None:
    """As Codex sends a turn: the whole conversation, the search items in it."""
    call = {"type": "tool_search_call", "call_id": "search-1", "execution": "client",
            "arguments": {"query": "calendar", "limit": 1}}
    loaded = {"type": "tool_search_output", "call_id": "search-1", "execution": "client", "status": "completed",
              "tools": [CALENDAR]}
    response = client.create(store=False, tools=[CLIENT_SEARCH], input=[
        {"role": "user", "content": "calendar"}, call, loaded])
    assert _of(response, "function_call")[0]["name"] == "create_event"
    seen = SCRIPTED.requests[-1]
    assert seen.messages[-2].tool_calls[0].tool_search == "client"
    assert seen.messages[-1].loaded is not None and seen.messages[-1].loaded.execution == "client"


# ---------------------------------------------------------------- refused


@pytest.mark.parametrize(("tools", "code", "param"), [
    ([SHELL, WEATHER], "tool_search_required", "tools[1].defer_loading"),
    ([{**CRM, "defer_loading": None, "tools": [LOOKUP, {**INVOICES, "defer_loading": True}]}],
     "tool_search_required", "tools[0].tools[1].defer_loading"),
    ([WEATHER, SEARCH, SEARCH], "invalid_value", "tools[2]"),
    ([WEATHER, {**SHELL, "name": "tool_search"}, SEARCH], "duplicate_tool_name", "tools[1].name"),
    ([WEATHER, {"type": "tool_search", "execution": "anywhere"}], "invalid_value", "tools[1].execution"),
    ([{"type": "tool_search", "execution": "client", "parameters": {"type": "nothing"}}], "invalid_tool_schema",
     "tools[0].parameters"),
])
def test_tools_that_do_not_hold_together_are_refused(client: Client, tools: list[Any], code: str,
                                                     param: str) -> None:
    error = client.error({"input": "hi", "tools": tools}, 400)
    assert (error["code"], error["param"]) == (code, param)


def test_a_forced_call_of_a_tool_not_loaded_is_refused(client: Client) -> None:
    error = client.error({"input": "hi", "tools": TOOLS, "tool_choice": {"type": "function", "name": "get_weather"}},
                         400)
    assert error["param"] == "tool_choice.name" and "deferred" in error["message"]


CALL = {"type": "tool_search_call", "call_id": "c1", "execution": "client", "arguments": {"query": "x"}}


@pytest.mark.parametrize(("items", "code", "param"), [
    ([CALL, {"type": "tool_search_output", "call_id": "c1", "execution": "client", "tools": [{"type": "function"}]}],
     "missing_required_parameter", "input[2].tools[0].name"),
    ([CALL, {"type": "tool_search_output", "call_id": "c1", "execution": "client",
             "tools": [{"type": "namespace", "name": "n", "tools": [{"type": "function", "name": "a b"}]}]}],
     "invalid_value", "input[2].tools[0].tools[0].name"),
    ([CALL, {"type": "tool_search_output", "call_id": "c1", "execution": "client", "tools": "all"}],
     "invalid_value", "input[2].tools"),
    ([{"type": "tool_search_output", "call_id": "nope", "execution": "client", "tools": []}], "call_id", "input[1]"),
    ([{"type": "tool_search_output", "execution": "client", "tools": []}], "call_id", "input[1]"),
    ([{"type": "function_call", "call_id": "f1", "name": "shell", "arguments": "{}"},
      {"type": "tool_search_output", "call_id": "f1", "execution": "client", "tools": []}],
     "not_function_call", "input[2]"),
    ([{"type": "tool_search_call", "call_id": "c1", "execution": "client", "arguments": "calendar"}],
     "invalid_value", "input[1].arguments"),
    ([{"type": "tool_search_call", "call_id": "c1", "execution": "client", "arguments": {}},
      {"type": "tool_search_output", "call_id": "c1", "execution": "client", "tools": []},
      {"type": "tool_search_output", "call_id": "c1", "execution": "client", "tools": []}],
     "duplicate_output", "input[3]"),
])
def test_malformed_search_items_are_refused(client: Client, items: list[Any], code: str, param: str) -> None:
    error = client.error({"tools": [CLIENT_SEARCH], "input": [{"role": "user", "content": "hi"}, *items]}, 400)
    assert (error["code"], error["param"]) == (code, param)


def output_text_of(item: dict[str, Any]) -> str:
    return "".join(part.get("text", "") for part in item.get("content", []))

