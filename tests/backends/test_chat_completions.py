"""The Chat Completions backend against a real upstream and a scripted one.

The real upstream is llama-cpp-python's own server with SmolLM2 (see ``tests.upstream_server``
for what that server does and does not do). The scripted upstream stands in for the faults
and dialects a real server cannot be made to produce on demand.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.backends.base import (
    ChatMessage,
    Delta,
    Finish,
    GenerationRequest,
    ModelInfo,
    OutputFormat,
    ReasoningDelta,
    Sampling,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolPolicy,
    ToolSpec,
    Usage,
)
from app.backends.chat_completions import ChatCompletionsBackend
from app.backends.http_client import Timeouts
from app.backends.sse_parser import SSEParser
from app.errors import ContextLengthExceeded, InvalidRequest, ModelError, ModelNotFound, ORSError, TooManyRequests
from tests.upstream_server import (
    CUT,
    DONE,
    SMOLLM2_ALIAS,
    Pause,
    ScriptedUpstream,
    chunk,
    running_llama_server,
    running_scripted_upstream,
    tool_call,
    usage_chunk,
)

pytestmark = pytest.mark.anyio

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather in a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)


def ask(model: str, text: str = "Say hello.", **fields: Any) -> GenerationRequest:
    return GenerationRequest(model=model, messages=(ChatMessage("user", text),), **fields)


async def collect(backend: ChatCompletionsBackend, request: GenerationRequest) -> list[Delta]:
    return [delta async for delta in backend.stream(request)]


def text_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, TextDelta))


def arguments_by_index(deltas: list[Delta]) -> dict[int, str]:
    calls: dict[int, str] = {}
    for delta in deltas:
        if isinstance(delta, ToolCallDelta):
            calls[delta.index] = calls.get(delta.index, "") + delta.arguments
    return calls


def assert_one_final_finish(deltas: list[Delta]) -> Finish:
    finishes = [d for d in deltas if isinstance(d, Finish)]
    assert len(finishes) == 1 and deltas[-1] is finishes[0], deltas
    return finishes[0]


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with running_scripted_upstream() as scripted:
        yield scripted


@pytest.fixture
async def backend(upstream: ScriptedUpstream) -> AsyncIterator[ChatCompletionsBackend]:
    chat = ChatCompletionsBackend(upstream.base_url, api_key="test-key")
    await chat.start()
    yield chat
    await chat.aclose()


@pytest.fixture(scope="module")
def llama_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llama-server") / "server.log"


@pytest.fixture(scope="module")
def llama_url(llama_log: Path) -> Iterator[str]:
    with running_llama_server(log_path=llama_log) as base_url:
        yield base_url


@pytest.fixture
async def llama(llama_url: str) -> AsyncIterator[ChatCompletionsBackend]:
    chat = ChatCompletionsBackend(llama_url, schema_style="json_object_schema")
    await chat.start()
    yield chat
    await chat.aclose()


# -- against the real upstream: llama-cpp-python's server with SmolLM2 ----------------------


@pytest.mark.model
async def test_real_text_streams_then_one_finish(llama: ChatCompletionsBackend) -> None:
    request = GenerationRequest(
        model=SMOLLM2_ALIAS,
        messages=(ChatMessage("developer", "Answer briefly."), ChatMessage("user", "Say hello.")),
        sampling=Sampling(temperature=0, max_output_tokens=24),
    )
    deltas = await collect(llama, request)
    finish = assert_one_final_finish(deltas)
    assert all(isinstance(d, TextDelta) for d in deltas[:-1]) and len(deltas) > 2
    assert text_of(deltas).strip()
    assert finish.reason in ("stop", "length")
    assert finish.usage is None  # that server ignores stream_options and never streams usage


@pytest.mark.model
async def test_real_small_token_limit_reports_length(llama: ChatCompletionsBackend) -> None:
    request = ask(SMOLLM2_ALIAS, "Write a long story.", sampling=Sampling(temperature=0, max_output_tokens=3))
    deltas = await collect(llama, request)
    assert assert_one_final_finish(deltas).reason == "length"
    assert 1 <= len(deltas) - 1 <= 3


@pytest.mark.model
async def test_real_json_schema_output_parses(llama: ChatCompletionsBackend) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    request = ask(
        SMOLLM2_ALIAS,
        "Alice is 30 years old. Give her name and age as JSON.",
        sampling=Sampling(temperature=0, max_output_tokens=60),
        output_format=OutputFormat(kind="json_schema", name="person", schema=schema, strict=True),
    )
    deltas = await collect(llama, request)
    assert assert_one_final_finish(deltas).reason == "stop"
    value = json.loads(text_of(deltas))
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)


@pytest.mark.model
async def test_real_standard_json_schema_form_fails_as_that_server_answers_500(llama_url: str) -> None:
    standard = ChatCompletionsBackend(llama_url)  # schema_style="json_schema"
    request = ask(SMOLLM2_ALIAS, output_format=OutputFormat(kind="json_schema", schema={"type": "object"}))
    try:
        with pytest.raises(ModelError) as failure:
            await collect(standard, request)
    finally:
        await standard.aclose()
    assert failure.value.code == "upstream_error"
    assert "llama_cpp" not in failure.value.message  # its traceback excerpt stays in our log


@pytest.mark.model
async def test_real_named_tool_choice_streams_one_call(llama: ChatCompletionsBackend) -> None:
    request = ask(
        SMOLLM2_ALIAS,
        "What is the weather in Paris?",
        tools=(WEATHER,),
        tool_policy=ToolPolicy(mode="required", allowed=("get_weather",)),
        sampling=Sampling(temperature=0, max_output_tokens=60),
    )
    deltas = await collect(llama, request)
    assert assert_one_final_finish(deltas).reason == "tool_calls"
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert calls[0].name == "get_weather" and calls[0].call_id
    assert all(d.index == 0 and d.name is None and d.call_id is None for d in calls[1:])  # name and id sent once
    assert "city" in json.loads(arguments_by_index(deltas)[0])


@pytest.mark.model
async def test_real_unknown_model_is_served_by_the_default_model(llama: ChatCompletionsBackend) -> None:
    deltas = await collect(llama, ask("no-such-model", sampling=Sampling(max_output_tokens=4)))
    assert text_of(deltas) and assert_one_final_finish(deltas).reason == "length"


@pytest.mark.model
async def test_real_context_overflow_in_a_stream_fails_and_the_next_request_works(
    llama: ChatCompletionsBackend
) -> None:
    with pytest.raises(ModelError) as failure:
        await collect(llama, ask(SMOLLM2_ALIAS, "hello world " * 1500))
    assert failure.value.code == "upstream_disconnected"  # 200 with an empty body: nothing finished
    # The server closes that connection ~10 ms after the empty body, without saying so; the
    # next request must not fail on the dead pooled connection.
    deltas = await collect(llama, ask(SMOLLM2_ALIAS, sampling=Sampling(max_output_tokens=2)))
    assert assert_one_final_finish(deltas).reason == "length"


@pytest.mark.model
async def test_real_closing_the_stream_makes_the_server_stop(llama: ChatCompletionsBackend, llama_log: Path) -> None:
    story = ask(
        SMOLLM2_ALIAS,
        "Write a very long story about a dragon who loves books.",
        sampling=Sampling(temperature=0, max_output_tokens=1000),
    )
    log_start = llama_log.stat().st_size
    stream = llama.stream(story)
    received = [await anext(stream) for _ in range(3)]
    assert all(isinstance(d, TextDelta) for d in received)
    await stream.aclose()
    deadline = time.monotonic() + 30
    while b"Disconnected from client" not in llama_log.read_bytes()[log_start:]:
        assert time.monotonic() < deadline, "the server did not notice the closed stream"
        await asyncio.sleep(0.05)
    deltas = await collect(llama, ask(SMOLLM2_ALIAS, sampling=Sampling(max_output_tokens=2)))
    assert assert_one_final_finish(deltas).reason == "length"


@pytest.mark.model
async def test_real_model_list(llama: ChatCompletionsBackend) -> None:
    assert [info.id for info in await llama.fetch_models()] == [SMOLLM2_ALIAS]


@pytest.mark.model
async def test_real_stopped_server_is_unavailable() -> None:
    with running_llama_server() as base_url:
        chat = ChatCompletionsBackend(base_url)
        assert isinstance((await collect(chat, ask(SMOLLM2_ALIAS, sampling=Sampling(max_output_tokens=1))))[-1], Finish)
    try:
        with pytest.raises(ModelError) as failure:
            await collect(chat, ask(SMOLLM2_ALIAS))
        assert failure.value.code == "upstream_unavailable"
        assert "127.0.0.1" not in failure.value.message
        assert await chat.fetch_models() == []  # best effort: no allow-list, nothing cached
    finally:
        await chat.aclose()


# -- the request sent upstream --------------------------------------------------------------


async def test_request_carries_conversation_tools_and_settings(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.stream(chunk(content="ok", finish_reason="stop"), DONE)
    request = GenerationRequest(
        model=model,
        messages=(
            ChatMessage("developer", "Be brief."),
            ChatMessage("user", "Weather in Paris?"),
            ChatMessage("assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city":"Paris"}'),)),
            ChatMessage("tool", '{"temp_c": 18}', tool_call_id="call_1"),
            ChatMessage("assistant", "It is 18 °C.", reasoning="The tool said 18."),
            ChatMessage("user", "Thanks"),
        ),
        tools=(WEATHER, ToolSpec(name="now")),
        tool_policy=ToolPolicy(mode="required", allowed=("get_weather",), parallel=False),
        sampling=Sampling(
            temperature=0.2, top_p=0.9, max_output_tokens=50, presence_penalty=0.1, frequency_penalty=0.3
        ),
        output_format=OutputFormat(kind="json_schema", name="answer", schema={"type": "object"}, strict=True),
        reasoning_effort="low",
    )
    await collect(backend, request)
    sent = upstream.requests_for(model)[0]
    assert sent.headers["authorization"] == "Bearer test-key"
    assert sent.headers["accept"] == "text/event-stream"
    assert sent.body == {
        "model": model,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "content": '{"temp_c": 18}', "tool_call_id": "call_1"},
            {"role": "assistant", "content": "It is 18 °C."},
            {"role": "user", "content": "Thanks"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather in a city",
                    "parameters": WEATHER.parameters,
                },
            },
            {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 50,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.3,
        "reasoning_effort": "low",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
        },
    }


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (ToolPolicy(), None),
        (ToolPolicy(mode="auto", allowed=("get_weather",)), None),
        (ToolPolicy(mode="none"), "none"),
        (ToolPolicy(mode="required"), "required"),
        (ToolPolicy(mode="required", allowed=("get_weather", "now")), "required"),
        (ToolPolicy(mode="required", allowed=("now",)), {"type": "function", "function": {"name": "now"}}),
    ],
)
def test_tool_choice_follows_the_policy(policy: ToolPolicy, expected: Any) -> None:
    chat = ChatCompletionsBackend("http://127.0.0.1:1/v1")
    body = chat.payload(ask("m", tools=(WEATHER, ToolSpec(name="now")), tool_policy=policy))
    assert body.get("tool_choice") == expected
    assert len(body["tools"]) == 2  # every tool stays visible whatever is allowed


@pytest.mark.parametrize(
    ("policy", "expected", "sent"),
    [
        (ToolPolicy(mode="required", allowed=("now",)), "required", ["now"]),
        (ToolPolicy(mode="required", allowed=("get_weather", "now")), "required", ["get_weather", "now"]),
        (ToolPolicy(mode="required"), "required", ["get_weather", "now"]),
        (ToolPolicy(mode="auto", allowed=("now",)), None, ["get_weather", "now"]),
    ],
)
def test_without_named_tool_choice_a_required_call_is_among_the_tools_it_may_be(
        policy: ToolPolicy, expected: Any, sent: list[str]) -> None:
    """llama.cpp's own server reads ``tool_choice`` as a string alone."""
    chat = ChatCompletionsBackend("http://127.0.0.1:1/v1", named_tool_choice=False)
    body = chat.payload(ask("m", tools=(WEATHER, ToolSpec(name="now")), tool_policy=policy))
    assert body.get("tool_choice") == expected
    assert [tool["function"]["name"] for tool in body["tools"]] == sent


def test_no_tools_means_no_tool_settings() -> None:
    chat = ChatCompletionsBackend("http://127.0.0.1:1/v1")
    body = chat.payload(ask("m", tool_policy=ToolPolicy(mode="none", parallel=False)))
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(body)


def test_dialect_settings() -> None:
    request = GenerationRequest(
        model="m",
        messages=(ChatMessage("assistant", "a", reasoning="r"),),
        sampling=Sampling(max_output_tokens=7),
        output_format=OutputFormat(kind="json_schema", schema={"type": "object"}),
    )
    chat = ChatCompletionsBackend(
        "http://127.0.0.1:1/v1",
        token_limit_field="max_completion_tokens",
        schema_style="json_object_schema",
        replay_reasoning=True,
    )
    body = chat.payload(request)
    assert body["max_completion_tokens"] == 7 and "max_tokens" not in body
    assert body["response_format"] == {"type": "json_object", "schema": {"type": "object"}}
    assert body["messages"] == [{"role": "assistant", "content": "a", "reasoning_content": "r"}]
    plain = ChatCompletionsBackend("http://127.0.0.1:1/v1")
    json_mode = plain.payload(ask("m", output_format=OutputFormat(kind="json_object")))
    assert json_mode["response_format"] == {"type": "json_object"}
    assert "response_format" not in plain.payload(ask("m"))


def test_base_url_must_be_http() -> None:
    with pytest.raises(ValueError):
        ChatCompletionsBackend("localhost:11434/v1")
    assert ChatCompletionsBackend("http://127.0.0.1:11434/v1/").base_url == "http://127.0.0.1:11434/v1"


# -- decoding the stream --------------------------------------------------------------------


async def test_text_usage_and_finish(backend: ChatCompletionsBackend, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(
        chunk(content=""),
        chunk(content="Hel"),
        chunk(content="lo"),
        chunk(finish_reason="stop"),
        usage_chunk(12, 5, cached_tokens=8, reasoning_tokens=2),
        DONE,
    )
    deltas = await collect(backend, ask(model))
    assert deltas == [
        TextDelta("Hel"),
        TextDelta("lo"),
        Finish("stop", Usage(input_tokens=12, output_tokens=5, cached_tokens=8, reasoning_tokens=2)),
    ]


async def test_reasoning_in_either_field_is_not_doubled(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.stream(
        chunk(reasoning_content="Think"),
        chunk(reasoning=" more"),
        chunk(reasoning_content=" once", reasoning=" once"),
        chunk(content="Answer."),
        chunk(finish_reason="stop"),
        DONE,
    )
    deltas = await collect(backend, ask(model))
    reasoning = [ReasoningDelta("Think"), ReasoningDelta(" more"), ReasoningDelta(" once")]
    assert deltas == [*reasoning, TextDelta("Answer."), Finish("stop")]


async def test_tool_call_split_across_chunks(backend: ChatCompletionsBackend, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(
        chunk(tool_calls=[tool_call(0, id="call_a", name="get_weather", arguments="")]),
        chunk(tool_calls=[tool_call(0, arguments='{"ci')]),
        chunk(tool_calls=[tool_call(0, arguments='ty": "Pa')]),
        chunk(tool_calls=[tool_call(0, arguments='ris"}')]),
        chunk(finish_reason="tool_calls"),
        usage_chunk(20, 9),
        DONE,
    )
    deltas = await collect(backend, ask(model, tools=(WEATHER,)))
    assert deltas[0] == ToolCallDelta(index=0, name="get_weather", arguments="", call_id="call_a")
    assert all(d.name is None and d.call_id is None for d in deltas[1:-1] if isinstance(d, ToolCallDelta))
    assert json.loads(arguments_by_index(deltas)[0]) == {"city": "Paris"}
    assert assert_one_final_finish(deltas) == Finish("tool_calls", Usage(20, 9))


async def test_tool_call_in_one_burst_with_a_stop_reason(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.stream(
        chunk(tool_calls=[tool_call(0, id="call_x", name="get_weather", arguments={"city": "Oslo"})]),
        chunk(finish_reason="stop"),
        DONE,
    )
    deltas = await collect(backend, ask(model, tools=(WEATHER,)))
    assert deltas == [
        ToolCallDelta(index=0, name="get_weather", arguments='{"city": "Oslo"}', call_id="call_x"),
        Finish("tool_calls"),
    ]


async def test_parallel_calls_keep_their_own_arguments(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.stream(
        chunk(tool_calls=[tool_call(0, id="call_1", name="get_weather", arguments='{"city":')]),
        chunk(tool_calls=[tool_call(1, id="call_2", name="get_weather", arguments='{"city":')]),
        chunk(tool_calls=[tool_call(0, arguments=' "Rome"}'), tool_call(1, arguments=' "Lima"}')]),
        chunk(finish_reason="tool_calls"),
        DONE,
    )
    deltas = await collect(backend, ask(model, tools=(WEATHER,)))
    starts = [d for d in deltas if isinstance(d, ToolCallDelta) and d.name]
    assert [(d.index, d.call_id) for d in starts] == [(0, "call_1"), (1, "call_2")]
    arguments = {index: json.loads(text) for index, text in arguments_by_index(deltas).items()}
    assert arguments == {0: {"city": "Rome"}, 1: {"city": "Lima"}}


async def test_a_new_id_on_a_reused_index_is_a_new_call(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.stream(
        chunk(tool_calls=[tool_call(0, id="call_1", name="get_weather", arguments='{"city": "Rome"}')]),
        chunk(tool_calls=[tool_call(0, id="call_2", name="now", arguments="{}")]),
        chunk(finish_reason="tool_calls"),
        DONE,
    )
    deltas = await collect(backend, ask(model, tools=(WEATHER, ToolSpec(name="now"))))
    assert deltas[:2] == [
        ToolCallDelta(index=0, name="get_weather", arguments='{"city": "Rome"}', call_id="call_1"),
        ToolCallDelta(index=1, name="now", arguments="{}", call_id="call_2"),
    ]


async def test_name_and_id_repeated_on_every_delta_are_sent_once(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    pieces = ['{"city"', ': "Bern"', "}"]
    model = upstream.stream(
        *(chunk(tool_calls=[tool_call(0, id="call_r", name="get_weather", arguments=p)]) for p in pieces),
        chunk(finish_reason="tool_calls"),
        DONE,
    )
    deltas = await collect(backend, ask(model, tools=(WEATHER,)))
    assert deltas[:3] == [
        ToolCallDelta(index=0, name="get_weather", arguments='{"city"', call_id="call_r"),
        ToolCallDelta(index=0, arguments=': "Bern"'),
        ToolCallDelta(index=0, arguments="}"),
    ]


async def test_arguments_before_the_name_are_held_back(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.stream(
        chunk(tool_calls=[tool_call(0, id="call_h", arguments='{"city"')]),
        chunk(tool_calls=[tool_call(0, name="get_weather", arguments=': "Kyiv"}')]),
        chunk(finish_reason="tool_calls"),
        DONE,
    )
    deltas = await collect(backend, ask(model, tools=(WEATHER,)))
    assert deltas[0] == ToolCallDelta(index=0, name="get_weather", arguments='{"city": "Kyiv"}', call_id="call_h")


async def test_calls_without_index_follow_their_id(backend: ChatCompletionsBackend, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(
        chunk(tool_calls=[tool_call(None, id="a", name="get_weather", arguments='{"city":')]),
        chunk(tool_calls=[tool_call(None, id="b", name="now", arguments="{}")]),
        chunk(tool_calls=[tool_call(None, id="a", arguments=' "Quito"}')]),
        chunk(finish_reason="tool_calls"),
        DONE,
    )
    deltas = await collect(backend, ask(model, tools=(WEATHER, ToolSpec(name="now"))))
    assert arguments_by_index(deltas) == {0: '{"city": "Quito"}', 1: "{}"}


async def test_a_call_that_never_gets_a_name_fails(backend: ChatCompletionsBackend, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(
        chunk(tool_calls=[tool_call(0, id="c", arguments="{}")]), chunk(finish_reason="tool_calls"), DONE
    )
    with pytest.raises(ModelError):
        await collect(backend, ask(model, tools=(WEATHER,)))


async def test_sse_framing_variants(backend: ChatCompletionsBackend, upstream: ScriptedUpstream) -> None:
    first = json.dumps(chunk(content="a\u2028b\u0085c ")).encode()
    model = upstream.stream(
        ": keep-alive\n\n",
        b"data: " + first[:10],
        first[10:] + b"\r\n\r\n",
        "event: message\r\ndata: {\"choices\": [{\"index\": 0,\r\ndata:  \"delta\": {\"content\": \"\xe9\"}}]}\r\r",
        b"data: " + json.dumps(chunk(content="\u00e8")).encode("utf-8")[:-3],
        json.dumps(chunk(content="\u00e8")).encode("utf-8")[-3:] + b"\n\n",
        "data:" + json.dumps(chunk(finish_reason="stop")) + "\n\n",
        "data: [DONE]",
    )
    deltas = await collect(backend, ask(model))
    assert deltas == [TextDelta("a\u2028b\u0085c "), TextDelta("é"), TextDelta("è"), Finish("stop")]


def test_sse_parser_splits_multibyte_and_crlf_anywhere() -> None:
    raw = 'data: {"x": "\u00e9\u2028"}\r\n\r\n: ping\r\n\r\nevent: error\ndata: boom\n\n'.encode()
    for cut in range(len(raw)):
        parser, events = SSEParser(), []
        decoder = codecs.getincrementaldecoder("utf-8")()
        for piece in (raw[:cut], raw[cut:]):
            events += parser.feed(decoder.decode(piece))
        events += parser.feed("", final=True)
        assert events == [("message", '{"x": "\u00e9\u2028"}'), ("error", "boom")], cut


async def test_done_without_a_finish_reason_is_a_stop(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.stream(chunk(content="hi"), DONE)
    assert await collect(backend, ask(model)) == [TextDelta("hi"), Finish("stop")]


async def test_a_finish_reason_without_done_is_complete(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.stream(chunk(content="hi"), chunk(finish_reason="length"))
    assert await collect(backend, ask(model)) == [TextDelta("hi"), Finish("length")]


async def test_unknown_finish_reasons_are_a_stop(backend: ChatCompletionsBackend, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(chunk(content="hi"), chunk(finish_reason="eos_token"), DONE)
    assert (await collect(backend, ask(model)))[-1] == Finish("stop")


async def test_a_stream_that_ends_before_finishing_fails(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.stream(chunk(content="partial"))
    received: list[Delta] = []
    with pytest.raises(ModelError) as failure:
        async for delta in backend.stream(ask(model)):
            received.append(delta)
    assert received == [TextDelta("partial")]
    assert failure.value.code == "upstream_disconnected"


async def test_a_connection_cut_mid_stream_fails(backend: ChatCompletionsBackend, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(chunk(content="partial"), Pause(0.05), CUT)
    received: list[Delta] = []
    with pytest.raises(ModelError) as failure:
        async for delta in backend.stream(ask(model)):
            received.append(delta)
    assert received == [TextDelta("partial")]
    assert failure.value.code == "upstream_disconnected"
    assert len(upstream.requests_for(model)) == 1  # output was seen: never retried


async def test_a_connection_cut_before_any_event_is_retried_once(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.stream(CUT)
    upstream.stream(chunk(content="second try", finish_reason="stop"), DONE, model=model)
    assert await collect(backend, ask(model)) == [TextDelta("second try"), Finish("stop")]
    assert len(upstream.requests_for(model)) == 2

    always_cut = upstream.stream(CUT)
    with pytest.raises(ModelError) as failure:
        await collect(backend, ask(always_cut))
    assert failure.value.code == "upstream_disconnected"
    assert len(upstream.requests_for(always_cut)) == 2


@pytest.mark.parametrize(
    "error_event",
    [
        f"data: {json.dumps({'error': {'message': 'CUDA out of memory', 'type': 'server_error'}})}\n\n",
        'event: error\ndata: {"message": "CUDA out of memory"}\n\n',
        'error: {"code": 500, "message": "CUDA out of memory", "type": "server_error"}\n\n',
    ],
    ids=["error-object", "error-event", "error-field"],
)
async def test_an_error_inside_the_stream_fails(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream, error_event: str
) -> None:
    model = upstream.stream(chunk(content="partial"), error_event, DONE)
    with pytest.raises(ModelError) as failure:
        await collect(backend, ask(model))
    assert failure.value.code == "upstream_error"
    assert "CUDA out of memory" in failure.value.message


async def test_a_malformed_chunk_fails(backend: ChatCompletionsBackend, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(chunk(content="partial"), "data: {not json\n\n", DONE)
    with pytest.raises(ModelError) as failure:
        await collect(backend, ask(model))
    assert failure.value.code == "upstream_error"


async def test_chunks_are_read_as_the_standard_library_reads_them(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    # chunks are read by pydantic-core's parser; one it refuses (a lone surrogate
    # escape) is read by the standard library, as every chunk was before
    model = upstream.stream(
        'data: {"choices":[{"index":0,"delta":{"content":"caf\\u00e9 \\ud83d\\ude00"}}]}\n\n',
        'data: {"choices":[{"index":0,"delta":{"content":" cut \\ud83d"}}]}\n\n',
        chunk(finish_reason="stop"),
        DONE,
    )
    deltas = await collect(backend, ask(model))
    assert text_of(deltas) == "café 😀 cut \ud83d"
    assert isinstance(deltas[-1], Finish) and deltas[-1].reason == "stop"


async def test_a_whole_completion_is_accepted_when_the_server_ignores_streaming(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Checking.",
                    "tool_calls": [
                        {"id": f"c{n}", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
                        for n, arguments in ((1, '{"city": "Rome"}'), (2, '{"city": "Oslo"}'))
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
    }
    model = upstream.respond(200, completion)
    assert await collect(backend, ask(model, tools=(WEATHER,))) == [
        TextDelta("Checking."),
        ToolCallDelta(index=0, name="get_weather", arguments='{"city": "Rome"}', call_id="c1"),
        ToolCallDelta(index=1, name="get_weather", arguments='{"city": "Oslo"}', call_id="c2"),
        Finish("tool_calls", Usage(3, 4)),
    ]


async def test_an_output_wanted_only_whole_is_asked_without_streaming(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    completion = {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "reasoning_content": "Easy.", "content": "Hello there."}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}},
    }
    model = upstream.respond(200, completion)
    deltas = await collect(backend, ask(model, incremental=False))
    assert deltas == [ReasoningDelta("Easy."), TextDelta("Hello there."), Finish("stop", Usage(5, 3, cached_tokens=2))]
    (sent,) = upstream.requests_for(model)
    assert sent.body["stream"] is False and "stream_options" not in sent.body
    assert sent.headers["accept"] == "application/json"


async def test_a_whole_answer_cut_short_is_an_error_not_an_answer(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.respond(200, {"error": {"message": "the model crashed", "type": "server_error"}})
    with pytest.raises(ModelError) as failure:
        await collect(backend, ask(model, incremental=False))
    assert failure.value.code == "upstream_error"


# -- upstream HTTP failures -----------------------------------------------------------------


UPSTREAM_WORDS = "ECHO"


@pytest.mark.parametrize(
    ("status", "body", "error_type", "code", "echoed"),
    [
        (400, {"error": {"message": "temperature ECHO", "type": "invalid_request_error"}},
         InvalidRequest, "upstream_rejected", True),
        (422, {"detail": [{"loc": ["body", "top_p"], "msg": "ECHO"}]}, InvalidRequest, "upstream_rejected", True),
        (400, {"error": {"message": "maximum context length ECHO", "code": "context_length_exceeded"}},
         ContextLengthExceeded, "context_length_exceeded", True),
        (404, {"error": {"message": 'model "llama9" not found, ECHO'}}, ModelNotFound, "model_not_found", True),
        (401, {"error": {"message": "Incorrect API key provided: sk-ECHO"}}, ModelError, "upstream_auth", False),
        (403, {"error": "forbidden for org ECHO"}, ModelError, "upstream_auth", False),
        (429, {"error": {"message": "Rate limit reached for org ECHO"}},
         TooManyRequests, "upstream_rate_limited", False),
        (500, {"error": {"message": "Traceback: /srv/ECHO/app.py"}}, ModelError, "upstream_error", False),
        (503, {"error": "loading model ECHO"}, ModelError, "upstream_unavailable", False),
        (504, "gateway timeout ECHO", ModelError, "upstream_timeout", False),
    ],
)  # fmt: skip
async def test_http_failures_map_onto_the_taxonomy(
    backend: ChatCompletionsBackend,
    upstream: ScriptedUpstream,
    status: int,
    body: Any,
    error_type: type[ORSError],
    code: str,
    echoed: bool,
) -> None:
    """The upstream's words reach the client only when they describe the client's request."""
    model = upstream.respond(status, body)
    with pytest.raises(ORSError) as failure:
        await collect(backend, ask(model))
    assert type(failure.value) is error_type and failure.value.code == code
    assert (UPSTREAM_WORDS in failure.value.message) is echoed
    if error_type is ModelNotFound:
        assert failure.value.param == "model"


async def test_an_unknown_model_is_not_found(backend: ChatCompletionsBackend) -> None:
    with pytest.raises(ModelNotFound) as failure:
        await collect(backend, ask("never-registered"))
    assert failure.value.param == "model" and "never-registered" in failure.value.message


async def test_a_silent_upstream_times_out(upstream: ScriptedUpstream) -> None:
    model = upstream.stream(chunk(content="slow"), Pause(2.0), DONE)
    chat = ChatCompletionsBackend(upstream.base_url, timeout=Timeouts(connect=5.0, read=0.3))
    try:
        with pytest.raises(ModelError) as failure:
            await collect(chat, ask(model))
    finally:
        await chat.aclose()
    assert failure.value.code == "upstream_timeout"


async def test_nothing_listening_is_unavailable() -> None:
    with running_scripted_upstream() as gone:
        base_url = gone.base_url
    chat = ChatCompletionsBackend(base_url)
    try:
        with pytest.raises(ModelError) as failure:
            await collect(chat, ask("m"))
    finally:
        await chat.aclose()
    assert failure.value.code == "upstream_unavailable"


# -- cancellation ---------------------------------------------------------------------------


def endless(n: int = 400) -> list[Any]:
    steps: list[Any] = []
    for i in range(n):
        steps += [chunk(content=f"{i} "), Pause(0.02)]
    return [*steps, chunk(finish_reason="stop"), DONE]


async def test_closing_the_stream_disconnects_the_upstream(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.stream(*endless())
    stream = backend.stream(ask(model))
    assert await anext(stream) == TextDelta("0 ")
    await stream.aclose()
    assert await upstream.wait_for_disconnect(model)


async def test_cancelling_the_consumer_disconnects_the_upstream(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.stream(*endless())
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in backend.stream(ask(model)):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await upstream.wait_for_disconnect(model)


# -- models and lifecycle -------------------------------------------------------------------


async def test_model_list_from_the_upstream_filtered_and_cached(upstream: ScriptedUpstream) -> None:
    listed = upstream.stream(DONE)
    hidden = upstream.stream(DONE)
    chat = ChatCompletionsBackend(upstream.base_url, models=[listed, "configured-only"])
    try:
        assert chat.models() == [ModelInfo(listed, "upstream"), ModelInfo("configured-only", "upstream")]
        assert chat.serves(listed) and not chat.serves(hidden)
        assert await chat.fetch_models() == [ModelInfo(listed, "scripted")]
        fetches = sum(r.path == "/v1/models" for r in upstream.requests)
        await chat.fetch_models()
        assert sum(r.path == "/v1/models" for r in upstream.requests) == fetches  # cached
    finally:
        await chat.aclose()


async def test_without_an_allow_list_every_model_is_served() -> None:
    chat = ChatCompletionsBackend("http://127.0.0.1:1/v1")
    assert chat.serves("anything") and chat.models() == []


async def test_configured_headers_and_the_key_go_with_every_request(upstream: ScriptedUpstream) -> None:
    model = upstream.stream(chunk(content="hi", finish_reason="stop"), DONE)
    chat = ChatCompletionsBackend(upstream.base_url, api_key="sk-test", headers={"x-configured": "yes"})
    try:
        assert (await collect(chat, ask(model)))[-1] == Finish("stop")
    finally:
        await chat.aclose()
    sent = upstream.requests_for(model)[0].headers
    assert sent["x-configured"] == "yes" and sent["authorization"] == "Bearer sk-test"
    assert sent["accept"] == "text/event-stream" and sent["content-type"] == "application/json"


@pytest.mark.parametrize("headers", [{"x-split": "a\r\nX-Injected: b"}, {"x:colon": "a"}, {"": "a"}])
def test_a_header_that_cannot_be_sent_is_refused_with_the_configuration(headers: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="header"):
        ChatCompletionsBackend("http://127.0.0.1:1/v1", headers=headers)


def test_a_key_with_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError, match="header"):
        ChatCompletionsBackend("http://127.0.0.1:1/v1", api_key="sk\nX-Injected: yes")


@pytest.mark.parametrize("url", ["http://user:pw@127.0.0.1:1/v1", "http://127.0.0.1:1/v1?x=1"])
def test_a_base_url_with_credentials_or_a_query_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="base URL"):
        ChatCompletionsBackend(url)


async def test_a_connection_read_to_its_end_is_reused_and_aclose_ends_it(upstream: ScriptedUpstream) -> None:
    """Two requests in a row go over one kept-alive connection (the upstream sees one
    peer); after ``aclose`` the backend works again, on a new connection."""
    model = upstream.stream(chunk(content="hi", finish_reason="stop"), DONE)
    chat = ChatCompletionsBackend(upstream.base_url)
    await chat.start()
    try:
        await collect(chat, ask(model))
        await collect(chat, ask(model))
        await chat.aclose()
        await collect(chat, ask(model))  # started again on first use
    finally:
        await chat.aclose()
    first, second, third = (request.peer for request in upstream.requests_for(model))
    assert first == second and third != first


def test_the_body_sent_is_the_payload_with_each_messages_json_made_once() -> None:
    chat = ChatCompletionsBackend("http://127.0.0.1:1/v1")
    history = (ChatMessage(role="system", content="Be brief. «ü»"), ChatMessage(role="user", content="Hi"),
               ChatMessage(role="assistant", content="", tool_calls=(ToolCall("c1", "get_weather", '{"city":"Oslo"}'),)),
               ChatMessage(role="tool", content="12 C", tool_call_id="c1"))
    request = replace(ask("m", tools=(WEATHER,)), messages=history)
    body = chat._body(chat.payload(request, messages=False), request)
    assert json.loads(body) == chat.payload(request)
    assert len(chat._message_json[True]) == len(history)  # the model takes images: the messages with parts
    longer = replace(request, messages=(*history, ChatMessage(role="user", content="And Rome?")))
    assert json.loads(chat._body(chat.payload(longer, messages=False), longer)) == chat.payload(longer)
    assert len(chat._message_json[True]) == len(history) + 1  # the past messages' JSON was reused
