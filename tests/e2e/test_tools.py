"""Function tools end to end over HTTP: the tool loop on the default model (which decides
on its own to call a tool), tool_choice on the embedded backend and on a real upstream,
and the replay gate refusing a bad replay before any model runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from app.config import Settings
from app.main import create_app
from tests.client import Client, output_text
from tests.conftest import QWEN, SMOL
from tests.live import LiveServer
from tests.upstream_server import running_llama_server

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
}
SEARCH = {
    "type": "function",
    "name": "search_web",
    "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "Get the current time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
RESULT = json.dumps({"temp_c": 18, "condition": "light rain"})


def _calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == "function_call"]


# ---------------------------------------------------------------- the tool loop (default model)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_loop_by_previous_response_id(client: Client, stream: bool) -> None:
    create = client.stream if stream else client.create
    first = create(model=QWEN, input="What is the weather in Paris right now?", tools=[WEATHER],
                   max_output_tokens=128, temperature=0)
    first = first.final if stream else first  # type: ignore[union-attr]
    calls = _calls(first)  # type: ignore[arg-type]
    assert len(calls) == 1 and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"])["city"].lower() == "paris"
    second = create(model=QWEN, previous_response_id=first["id"], tools=[WEATHER],  # type: ignore[index]
                    input=[{"type": "function_call_output", "call_id": calls[0]["call_id"], "output": RESULT}],
                    max_output_tokens=128, temperature=0)
    second = second.final if stream else second  # type: ignore[union-attr]
    answer = output_text(second)  # type: ignore[arg-type]
    assert "18" in answer, answer


def test_tool_loop_by_resent_history(client: Client) -> None:
    question = {"role": "user", "content": "What is the weather in Paris right now?"}
    first = client.create(model=QWEN, input=[question], tools=[WEATHER], max_output_tokens=128, temperature=0)
    call = _calls(first)[0]
    history = [question, call, {"type": "function_call_output", "call_id": call["call_id"], "output": RESULT}]
    second = client.create(model=QWEN, input=history, tools=[WEATHER], max_output_tokens=128, store=False,
                           temperature=0)
    assert "18" in output_text(second)


def test_openai_sdk_tool_loop(server: LiveServer) -> None:
    sdk = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    first = sdk.responses.create(model=QWEN, input="What's the weather in Paris?", tools=[WEATHER],  # type: ignore[list-item]
                                 temperature=0)
    call = next(item for item in first.output if item.type == "function_call")
    second = sdk.responses.create(
        model=QWEN,
        previous_response_id=first.id,
        tools=[WEATHER],  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": RESULT}],
        temperature=0,
    )
    assert "18" in second.output_text


def test_openai_agents_run(server: LiveServer) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        seen.append(city)
        return RESULT

    async def run() -> str:
        async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
            return await run_with(client)

    async def run_with(client: AsyncOpenAI) -> str:
        agent = Agent(
            name="weather",
            instructions="Answer weather questions with the get_weather tool, then reply in one sentence.",
            tools=[get_weather],
            model=OpenAIResponsesModel(model=QWEN, openai_client=client),
            # greedy, and the first turn must call a tool: batched decoding on a shared
            # model is not bit-for-bit repeatable, so the call is not left to chance (the
            # SDK resets tool_choice to auto after the call, so the agent can then answer)
            model_settings=ModelSettings(temperature=0, tool_choice="required"),
        )
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        return str(result.final_output)

    final = asyncio.run(run())
    assert seen and seen[0].lower() == "paris"
    # the answer is made from the tool's result: the model words it as it likes, and on
    # a shared batch it sometimes names only one of its two facts
    assert "18" in final or "rain" in final.lower(), final


# ---------------------------------------------------------------- tool_choice on the embedded backend


def test_required_forces_a_valid_call(client: Client) -> None:
    response = client.create(model=SMOL, input="Hello there!", tools=[WEATHER], tool_choice="required",
                             max_output_tokens=64)
    call = _calls(response)[0]
    arguments = json.loads(call["arguments"])
    assert call["name"] == "get_weather" and isinstance(arguments["city"], str)
    assert arguments.get("unit", "celsius") in ("celsius", "fahrenheit")


def test_named_choice_calls_that_function(client: Client) -> None:
    response = client.create(model=SMOL, input="Tell me something.", tools=[WEATHER, SEARCH],
                             tool_choice={"type": "function", "name": "search_web"}, max_output_tokens=64)
    assert [call["name"] for call in _calls(response)] == ["search_web"]


def test_allowed_tools_is_a_hard_limit(client: Client) -> None:
    for _ in range(3):
        response = client.create(
            model=SMOL, input="What is the weather and the time in Paris?", tools=[WEATHER, SEARCH, TIME],
            tool_choice={"type": "allowed_tools", "mode": "required",
                         "tools": [{"type": "function", "name": "get_time"}, {"type": "function", "name": "search_web"}]},
            max_output_tokens=96, temperature=1.0,
        )
        names = {call["name"] for call in _calls(response)}
        assert names and names <= {"get_time", "search_web"}


def test_none_lets_no_call_out(client: Client) -> None:
    response = client.create(model=QWEN, input="Call get_weather for Paris now.", tools=[WEATHER],
                             tool_choice="none", max_output_tokens=48)
    assert not _calls(response)


def test_parallel_false_and_max_tool_calls(client: Client) -> None:
    prompt = "Get the weather in Paris, London and Rome."
    one = client.create(model=SMOL, input=prompt, tools=[WEATHER], tool_choice="required",
                        parallel_tool_calls=False, max_output_tokens=128)
    assert len(_calls(one)) == 1
    capped = client.create(model=SMOL, input=prompt, tools=[WEATHER], tool_choice="required",
                           max_tool_calls=2, max_output_tokens=160)
    assert 1 <= len(_calls(capped)) <= 2


# A tool whose call cannot fit in 16 tokens: the budget always runs out inside it.
REPORT = {
    "type": "function",
    "name": "file_a_detailed_weather_report_for_the_national_archive",
    "description": "File a long, detailed weather report.",
    "parameters": {
        "type": "object",
        "properties": {"complete_description_of_all_observed_conditions": {"type": "string"}},
        "required": ["complete_description_of_all_observed_conditions"],
    },
}


def _assert_budget_stop(response: dict[str, Any]) -> None:
    """A budget stop under tool_choice required: incomplete, never failed; whatever call
    was being written is closed incomplete."""
    assert response["status"] == "incomplete", response
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["error"] is None
    for call in _calls(response):
        assert call["status"] == "incomplete" and call["name"] == REPORT["name"]


@pytest.mark.parametrize("stream", [False, True])
def test_required_with_the_budget_spent_mid_call_is_incomplete(client: Client, stream: bool) -> None:
    body = {"model": SMOL, "input": "File the report.", "tools": [REPORT], "tool_choice": "required",
            "max_output_tokens": 16}
    if stream:
        result = client.stream(**body)
        assert result.types()[-1] == "response.incomplete"
        _assert_budget_stop(result.final)
    else:
        _assert_budget_stop(client.create(**body))


def test_a_call_cut_by_the_budget_reaches_the_client_incomplete(client: Client) -> None:
    """The scripted model (a stand-in: no real model can be made to stop at a chosen byte)
    is cut inside its call's arguments."""
    result = client.stream(model="scripted-tool-cut", input="x", tools=[WEATHER], tool_choice="required")
    final = result.final
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    [call] = _calls(final)
    assert (call["status"], call["arguments"]) == ("incomplete", '{"city": "Par')
    done = [event for event in result.events if event["type"] == "response.output_item.done"]
    assert done[-1]["item"] == call
    # an unfinished call can never be answered
    error = client.error({"model": "scripted-text", "previous_response_id": final["id"], "input": [
        {"type": "function_call_output", "call_id": call["call_id"], "output": "{}"}]}, 400)
    assert (error["code"], error["param"]) == ("status", "input[0]")


# ---------------------------------------------------------------- tool_choice on a real upstream


@pytest.fixture(scope="module")
def upstream_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    with running_llama_server(model_alias="upstream-smollm2") as url:
        settings = Settings(upstream_url=url, default_model="upstream-smollm2",
                            data_dir=tmp_path_factory.mktemp("tools-upstream"))
        server = LiveServer(create_app(settings)).start()
        client = Client(server.url)
        yield client
        client.close()
        server.stop()


@pytest.mark.model
def test_upstream_named_choice(upstream_front: Client) -> None:
    response = upstream_front.create(input="Weather in Paris?", tools=[WEATHER, SEARCH],
                                     tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=64)
    assert [call["name"] for call in _calls(response)] == ["get_weather"]


@pytest.mark.model
def test_upstream_allowed_tools_suppresses_other_calls(upstream_front: Client) -> None:
    response = upstream_front.create(
        input="Weather in Paris?", tools=[WEATHER, SEARCH],
        tool_choice={"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "search_web"}]},
        max_output_tokens=64,
    )
    assert all(call["name"] == "search_web" for call in _calls(response))


@pytest.mark.model
def test_upstream_none(upstream_front: Client) -> None:
    response = upstream_front.create(input="Weather in Paris?", tools=[WEATHER], tool_choice="none",
                                     max_output_tokens=32)
    assert not _calls(response)


@pytest.mark.model
def test_upstream_required_and_parallel_false(upstream_front: Client) -> None:
    response = upstream_front.create(input="Weather in Paris and Rome?", tools=[WEATHER], tool_choice="required",
                                     parallel_tool_calls=False, max_tool_calls=1, max_output_tokens=96)
    assert len(_calls(response)) == 1


@pytest.mark.model
def test_upstream_required_with_the_budget_spent_is_incomplete(upstream_front: Client) -> None:
    _assert_budget_stop(upstream_front.create(input="File the report.", tools=[REPORT], tool_choice="required",
                                              max_output_tokens=16))


# ---------------------------------------------------------------- the gate over HTTP


def test_gate_refuses_an_out_of_enum_argument_before_the_model(client: Client, scripted) -> None:  # type: ignore[no-untyped-def]
    before = len(scripted.requests)
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": json.dumps({"city": "Paris", "unit": "kelvin"}), "status": "completed"}
    error = client.error({"model": "scripted-text", "tools": [WEATHER], "input": [
        {"role": "user", "content": "weather?"}, call,
        {"type": "function_call_output", "call_id": "call_1", "output": RESULT},
    ]}, 400)
    assert (error["code"], error["param"]) == ("arguments_schema", "input[2]")
    assert "kelvin" in error["message"]
    assert len(scripted.requests) == before  # nothing reached the model


def test_gate_refuses_a_chat_completions_envelope(client: Client) -> None:
    error = client.error({"model": "scripted-text", "input": [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                               "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "x"},
    ]}, 400)
    assert error["code"] == "chat_completions_envelope" and "function_call" in error["message"]


def test_gate_refuses_an_answer_to_an_unfinished_call(client: Client, scripted) -> None:  # type: ignore[no-untyped-def]
    response = client.create(model="scripted-length", input="x")  # ends incomplete
    assert response["status"] == "incomplete"
    error = client.error({"model": "scripted-text", "previous_response_id": response["id"], "input": [
        {"type": "function_call_output", "call_id": "call_nothing", "output": "{}"}]}, 400)
    assert error["code"] == "call_id"


REPLAYED_LOOP = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"type": "function_call", "call_id": "call_w1", "name": "get_weather", "arguments": '{"city": "Paris"}',
     "status": "completed"},
    {"type": "function_call_output", "call_id": "call_w1", "output": RESULT},
]


def test_gate_accepts_a_replayed_loop_without_tools(client: Client, scripted) -> None:  # type: ignore[no-untyped-def]
    """No tools and no previous_response_id: the spec only asks that the output answer a
    call in the context, so the request goes through (the finding is logged)."""
    response = client.create(model="scripted-text", input=REPLAYED_LOOP)
    assert response["status"] == "completed"
    seen = scripted.requests[-1]
    assert [message.role for message in seen.messages][-2:] == ["assistant", "tool"]
    assert seen.messages[-2].tool_calls[0].name == "get_weather"


def test_gate_unknown_tool_reject_is_an_operator_setting(tmp_path, scripted) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(gate_unknown_tool="reject", data_dir=tmp_path)
    server = LiveServer(create_app(settings, backends=[scripted])).start()
    strict = Client(server.url)
    try:
        error = strict.error({"model": "scripted-text", "input": REPLAYED_LOOP}, 400)
        assert (error["code"], error["param"]) == ("unknown_tool", "input[2]")
        assert strict.create(model="scripted-text", input=REPLAYED_LOOP, tools=[WEATHER])["status"] == "completed"
    finally:
        strict.close()
        server.stop()


def test_a_chat_completions_shaped_tool_names_the_missing_flat_field(client: Client) -> None:
    chat_tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["parameters"]}}
    error = client.error({"model": "scripted-text", "input": "hi", "tools": [chat_tool]}, 400)
    assert (error["code"], error["param"]) == ("missing_required_parameter", "tools[0].name")
    assert "flat" in error["message"]
    error = client.error({"model": "scripted-text", "input": "hi", "tools": [WEATHER],
                          "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, 400)
    assert (error["code"], error["param"]) == ("missing_required_parameter", "tool_choice.name")
