"""Tool search: the ranking of deferred tools, what a search loads, and a search run within
one response against a scripted model (named as such: it searches on demand)."""

from __future__ import annotations

from typing import Any

import pytest

from app.backends.base import (
    Delta,
    Finish,
    GenerationRequest,
    Sampling,
    TextDelta,
    ToolCallDelta,
    ToolSearchCallDelta,
    ToolSearchOutputDelta,
    Usage,
)
from app.backends.scripted import ScriptedBackend
from app.engine.tool_search import Catalog, ToolSearchLimits, loadable, terms, tool_surface
from app.engine.tool_search_loop import searching
from app.protocol.responses import CreateResponseBody
from app.protocol.tools import offered_functions
from app.schemas import SchemaLimits


def _function(name: str, description: str = "", **properties: str) -> dict[str, Any]:
    return {"type": "function", "name": name, "description": description, "defer_loading": True,
            "parameters": {"type": "object",
                           "properties": {key: {"type": "string", "description": about}
                                          for key, about in properties.items()}}}


TOOLS = [
    _function("send_email", "Send an email message.", to="Who receives it."),
    _function("get_weather", "The weather forecast for a city.", city="The city."),
    {"type": "namespace", "name": "calendar", "description": "Events and meetings.", "defer_loading": True,
     "tools": [_function("create_event", "Create an event."), _function("list_events", "List events.")]},
    _function("read_file", "Read a file.", path="Where the file is."),
]


def _catalog() -> Catalog:
    return Catalog(offered_functions(CreateResponseBody.model_validate({"tools": TOOLS}).tools))


def _names(found: list[Any]) -> list[str]:
    return [function.name for function in found]


def test_terms_are_lowercased_words_without_a_plural_s() -> None:
    assert terms("Send_emails to the Boss's CalendarEvents, 2 of them") == [
        "send", "email", "boss", "s", "calendarevent", "2", "them"]


@pytest.mark.parametrize(("query", "expected"), [
    ("weather", ["get_weather"]),
    ("email", ["send_email"]),
    ("meetings", ["calendar__create_event", "calendar__list_events"]),  # by their namespace's description
    ("create an event in my calendar", ["calendar__create_event", "calendar__list_events"]),
    ("path", ["read_file"]),  # by a parameter's name
    ("who receives it", ["send_email"]),  # by a parameter's description
    ("teleport", []),
])
def test_the_catalog_ranks_by_names_descriptions_and_parameters(query: str, expected: list[str]) -> None:
    assert _names(_catalog().search(query, 5)) == expected


def test_a_search_returns_at_most_its_limit_ties_in_the_request_order() -> None:
    catalog = _catalog()
    assert _names(catalog.search("create events", 1)) == ["calendar__create_event"]
    assert _names(catalog.search("list events", 1)) == ["calendar__list_events"]
    assert catalog.search("events", 0) == []
    twins = Catalog(offered_functions(CreateResponseBody.model_validate(
        {"tools": [_function("y_tool", "Same."), _function("x_tool", "Same.")]}).tools))
    assert _names(twins.search("same", 2)) == ["y_tool", "x_tool"]


def test_loaded_functions_of_a_namespace_stay_inside_it() -> None:
    found = _catalog().search("calendar weather", 5)
    tools = loadable(found)
    assert _names(found) == ["get_weather", "calendar__create_event", "calendar__list_events"]
    assert [tool["name"] for tool in tools] == ["get_weather", "calendar"]
    assert [inner["name"] for inner in tools[1]["tools"]] == ["create_event", "list_events"]
    assert tools[1]["description"] == "Events and meetings." and tools[0]["defer_loading"] is True


def _surface(model: str, *, rounds: int = 3, max_output_tokens: int | None = None) -> tuple[Any, GenerationRequest]:
    body = CreateResponseBody.model_validate({"model": model, "tools": [*TOOLS, {"type": "tool_search"}]})
    surface = tool_surface(body, (), hosts_search=False, limits=ToolSearchLimits(results=2, rounds=rounds),
                           schema_limits=SchemaLimits())
    request = GenerationRequest(model=model, messages=(), tools=surface.tools,
                                sampling=Sampling(max_output_tokens=max_output_tokens))
    return surface, request


async def _all(backend: ScriptedBackend, model: str, **options: Any) -> list[Delta]:
    surface, request = _surface(model, **options)
    return [delta async for delta in searching(backend, request, surface)]


@pytest.mark.anyio
async def test_a_search_runs_and_the_model_goes_on_with_usage_added_up() -> None:
    def model(request: GenerationRequest) -> list[Delta]:
        if request.late_tools:
            return [TextDelta("found"), Finish("stop", Usage(30, 2, cached_tokens=20))]
        return [ToolCallDelta(0, name="tool_search", arguments='{"query": "weather", "limit": 9}'),
                Finish("tool_calls", Usage(20, 5))]

    backend = ScriptedBackend({"m": model})
    deltas = await _all(backend, "m")
    call, output, text, finish = deltas
    assert isinstance(call, ToolSearchCallDelta) and call.arguments == {"query": "weather", "limit": 9}
    assert isinstance(output, ToolSearchOutputDelta) and output.names == ("get_weather",)
    assert call.call_id == output.call_id and call.call_id
    assert text == TextDelta("found")
    assert finish == Finish("stop", Usage(50, 7, cached_tokens=20))
    first, second = backend.requests
    assert second.tools == first.tools and [tool.name for tool in second.late_tools] == ["get_weather"]


@pytest.mark.anyio
async def test_each_round_gets_what_is_left_of_the_output_budget() -> None:
    def model(request: GenerationRequest) -> list[Delta]:
        return [ToolCallDelta(0, name="tool_search", arguments='{"query": "mail"}'), Finish("tool_calls", Usage(5, 6))]

    backend = ScriptedBackend({"m": model})
    deltas = await _all(backend, "m", max_output_tokens=16)
    assert [request.sampling.max_output_tokens for request in backend.requests] == [16, 10, 4]
    assert deltas[-1] == Finish("length", Usage(15, 18))


@pytest.mark.anyio
async def test_a_search_past_the_rounds_is_not_run() -> None:
    backend = ScriptedBackend({"m": [ToolCallDelta(0, name="tool_search", arguments='{"query": "mail"}'),
                                     Finish("tool_calls")]})
    deltas = await _all(backend, "m", rounds=1)
    assert [type(delta).__name__ for delta in deltas] == ["ToolSearchCallDelta", "ToolSearchOutputDelta", "Finish"]
    assert len(backend.requests) == 2 and deltas[-1].reason == "tool_calls"
