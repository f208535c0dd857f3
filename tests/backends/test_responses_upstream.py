"""The Responses upstream adapter: what it sends, and what it makes of what it gets.

The upstream here is the scripted stand-in of ``tests.upstream_server`` answering
``POST /v1/responses``: it plays sloppy and broken streams no real server produces on
demand. A real upstream (a second ors) is exercised in ``tests/e2e/test_responses_upstream.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import pytest

from app.backends.base import (
    ChatMessage,
    Delta,
    Finish,
    GenerationRequest,
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
from app.backends.responses_upstream import ResponsesUpstreamBackend, input_items
from app.backends.tool_names import wire_name
from app.errors import InvalidRequest, ModelError, ModelNotFound, TooManyRequests
from tests.upstream_server import CUT, DONE, ScriptedUpstream, running_scripted_upstream

pytestmark = pytest.mark.anyio

WEATHER = ToolSpec(name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}})
SEARCH = ToolSpec(name="search")


def ask(model: str, **fields: Any) -> GenerationRequest:
    return GenerationRequest(model=model, messages=(ChatMessage("user", "hi"),), **fields)


def completed(output: list[dict[str, Any]] | None = None, status: str = "completed", **extra: Any) -> dict[str, Any]:
    response: dict[str, Any] = {"status": status, "usage": {"input_tokens": 3, "output_tokens": 5,
                                                            "input_tokens_details": {"cached_tokens": 1},
                                                            "output_tokens_details": {"reasoning_tokens": 2}}}
    if output is not None:
        response["output"] = output
    response.update(extra)
    return {"type": f"response.{status}", "response": response}


def message(text: str, item_id: str = "m1") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def added(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def done(index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "response.output_item.done", "output_index": index, "item": item}


def text(delta: str, index: int = 0) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "output_index": index, "delta": delta}


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with running_scripted_upstream() as scripted:
        yield scripted


@pytest.fixture
async def backend(upstream: ScriptedUpstream) -> AsyncIterator[ResponsesUpstreamBackend]:
    adapter = ResponsesUpstreamBackend(upstream.base_url, api_key="k")
    await adapter.start()
    yield adapter
    await adapter.aclose()


async def collect(backend: ResponsesUpstreamBackend, request: GenerationRequest) -> list[Delta]:
    return [delta async for delta in backend.stream(request)]


def joined(deltas: list[Delta], kind: type[TextDelta] | type[ReasoningDelta] = TextDelta) -> str:
    return "".join(d.text for d in deltas if isinstance(d, kind))


# -- what is sent ----------------------------------------------------------------------------


def test_the_conversation_becomes_input_items() -> None:
    messages = (
        ChatMessage("system", "Be brief."),
        ChatMessage("developer", "Use tools."),
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "Let me look.", tool_calls=(ToolCall("call_1", "get_weather", '{"city":"Paris"}'),),
                    reasoning="Need the tool.", phase="commentary"),
        ChatMessage("tool", "sunny", tool_call_id="call_1"),
    )
    plain = input_items(messages)
    assert plain == [
        {"type": "message", "role": "system", "content": "Be brief."},
        {"type": "message", "role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": "Weather?"},
        {"type": "message", "role": "assistant", "phase": "commentary",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    replayed = input_items(messages, replay_reasoning=True)
    assert replayed[3] == {"type": "reasoning", "summary": [],
                           "content": [{"type": "reasoning_text", "text": "Need the tool."}]}
    assert replayed[4:] == plain[3:]


@pytest.mark.parametrize(("policy", "expected"), [
    (ToolPolicy(), None),
    (ToolPolicy(mode="none"), "none"),
    (ToolPolicy(mode="required"), "required"),
    (ToolPolicy(mode="required", allowed=("search",)), {"type": "function", "name": "search"}),
    (ToolPolicy(mode="auto", allowed=("search",)),
     {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "search"}]}),
])
def test_tool_choice(policy: ToolPolicy, expected: object) -> None:
    body = ResponsesUpstreamBackend("http://x/v1").payload(ask("m", tools=(WEATHER, SEARCH), tool_policy=policy))
    assert body.get("tool_choice") == expected
    assert [tool["name"] for tool in body["tools"]] == ["get_weather", "search"]


def test_the_payload_is_stateless_and_carries_the_settings() -> None:
    request = ask(
        "m",
        tools=(WEATHER,),
        tool_policy=ToolPolicy(parallel=False, max_calls=2),
        sampling=Sampling(temperature=0.2, top_p=0.9, max_output_tokens=64, logprobs=True, top_logprobs=3),
        output_format=OutputFormat(kind="json_schema", name="answer", schema={"type": "object"}, strict=True),
        reasoning_effort="low",
        cache_key="k1",
    )
    body = ResponsesUpstreamBackend("http://x/v1").payload(request)
    assert (body["stream"], body["store"]) == (True, False)
    assert "previous_response_id" not in body
    assert (body["parallel_tool_calls"], body["max_tool_calls"]) == (False, 2)
    assert (body["temperature"], body["top_p"], body["max_output_tokens"]) == (0.2, 0.9, 64)
    assert body["include"] == ["message.output_text.logprobs"] and body["top_logprobs"] == 3
    assert body["text"] == {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"},
                                       "strict": True}}
    assert body["reasoning"] == {"effort": "low"} and body["prompt_cache_key"] == "k1"


async def test_the_request_reaches_the_upstream(backend: ResponsesUpstreamBackend, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(text("hi"), completed(), DONE)
    await collect(backend, ask(model))
    sent = upstream.requests_for(model)[-1]
    assert sent.path == "/v1/responses" and sent.headers["authorization"] == "Bearer k"
    assert sent.headers["accept"] == "text/event-stream"


# -- what is made of the stream --------------------------------------------------------------


async def test_a_conformant_stream(backend: ResponsesUpstreamBackend, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(
        {"type": "response.created", "sequence_number": 0, "response": {"status": "in_progress"}},
        added(0, {"type": "reasoning", "id": "rs1", "summary": []}),
        {"type": "response.reasoning.delta", "output_index": 0, "item_id": "rs1", "delta": "Think."},
        done(0, {"type": "reasoning", "id": "rs1", "summary": [], "content": [{"type": "reasoning_text", "text": "Think."}]}),
        added(1, {"type": "message", "id": "m1", "role": "assistant", "content": []}),
        text("Hel", 1), text("lo", 1),
        done(1, message("Hello")),
        completed([{"type": "reasoning", "id": "rs1", "summary": []}, message("Hello")]),
    )
    deltas = await collect(backend, ask(model))
    assert deltas == [ReasoningDelta("Think."), TextDelta("Hel"), TextDelta("lo"),
                      Finish("stop", Usage(3, 5, cached_tokens=1, reasoning_tokens=2))]


async def test_a_sloppy_stream_is_repaired(backend: ResponsesUpstreamBackend, upstream: ScriptedUpstream) -> None:
    """No sequence numbers, no item ids, items without their required fields, a final
    message longer than what was streamed, a call whose final arguments differ."""
    model = upstream.stream(
        {"type": "response.created"},
        added(0, {"type": "message"}),
        {"type": "response.output_text.delta", "delta": "Hel"},
        text("lo"),
        done(0, message("Hello, world.")),
        added(1, {"type": "function_call", "name": "get_weather", "call_id": "c1"}),
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": '{"city": "Par'},
        done(1, {"type": "function_call", "name": "get_weather", "call_id": "c1", "arguments": '{"city": "Paris"}'}),
        {"type": "response.completed", "response": {"status": "completed"}},
    )
    deltas = await collect(backend, ask(model))
    assert deltas == [TextDelta("Hel"), TextDelta("lo"), TextDelta(", world."),
                      ToolCallDelta(0, name="get_weather", arguments='{"city": "Paris"}', call_id="c1"),
                      Finish("tool_calls", None)]


async def test_an_upstream_that_streams_only_final_items(backend: ResponsesUpstreamBackend,
                                                         upstream: ScriptedUpstream) -> None:
    model = upstream.stream(completed([message("All at once.")]), DONE)
    assert await collect(backend, ask(model)) == [TextDelta("All at once."), Finish("stop", Usage(3, 5, 1, 2))]


async def test_an_upstream_that_ignores_stream_true(backend: ResponsesUpstreamBackend,
                                                    upstream: ScriptedUpstream) -> None:
    model = upstream.respond(200, {**completed([message("Whole.")])["response"], "id": "resp_1"})
    assert joined(await collect(backend, ask(model))) == "Whole."


async def test_a_divergent_final_item(upstream: ScriptedUpstream) -> None:
    """Streamed text has reached the client and stands; with ``hold_text`` only the
    final item is sent."""
    steps = (text("Hi there"), done(0, message("Goodbye")), completed([message("Goodbye")]))
    model = upstream.stream(*steps)
    live = ResponsesUpstreamBackend(upstream.base_url)
    held = ResponsesUpstreamBackend(upstream.base_url, hold_text=True)
    assert joined(await collect(live, ask(model))) == "Hi there"
    assert joined(await collect(held, ask(model))) == "Goodbye"
    await live.aclose()
    await held.aclose()


async def test_reasoning_summaries_stand_in_for_missing_raw_reasoning(backend: ResponsesUpstreamBackend,
                                                                      upstream: ScriptedUpstream) -> None:
    model = upstream.stream(
        added(0, {"type": "reasoning", "id": "rs1", "summary": []}),
        {"type": "response.reasoning_summary_text.delta", "output_index": 0, "delta": "Briefly: yes."},
        done(0, {"type": "reasoning", "id": "rs1", "summary": [{"type": "summary_text", "text": "Briefly: yes."}]}),
        completed(),
    )
    assert joined(await collect(backend, ask(model)), ReasoningDelta) == "Briefly: yes."


@pytest.mark.parametrize(("details", "reason"), [({"reason": "max_output_tokens"}, "length"),
                                                 ({"reason": "content_filter"}, "content_filter")])
async def test_incomplete(backend: ResponsesUpstreamBackend, upstream: ScriptedUpstream,
                          details: dict[str, str], reason: str) -> None:
    model = upstream.stream(text("cut"), completed(status="incomplete", incomplete_details=details))
    assert (await collect(backend, ask(model)))[-1].reason == reason  # type: ignore[union-attr]


# -- failures --------------------------------------------------------------------------------


async def test_a_stream_without_its_end_is_a_disconnect(backend: ResponsesUpstreamBackend,
                                                        upstream: ScriptedUpstream) -> None:
    for steps in ((text("partial"),), (text("partial"), DONE), (text("partial"), CUT)):
        with pytest.raises(ModelError) as caught:
            await collect(backend, ask(upstream.stream(*steps)))
        assert caught.value.code == "upstream_disconnected"


async def test_response_failed(backend: ResponsesUpstreamBackend, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(text("x"), completed(status="failed", error={"code": "boom", "message": "it broke"}))
    with pytest.raises(ModelError) as caught:
        await collect(backend, ask(model))
    assert caught.value.code == "upstream_error" and "it broke" in caught.value.message


@pytest.mark.parametrize(("error", "kind", "param"), [
    ({"type": "invalid_request", "code": "x", "message": "bad temperature", "param": "temperature"},
     InvalidRequest, "temperature"),
    ({"type": "invalid_request", "message": "bad item", "param": "input[4].content"}, InvalidRequest, None),
    ({"type": "too_many_requests", "message": "slow down"}, TooManyRequests, None),
    ({"type": "server_error", "message": "oops"}, ModelError, None),
])
async def test_error_events(backend: ResponsesUpstreamBackend, upstream: ScriptedUpstream,
                            error: dict[str, Any], kind: type, param: str | None) -> None:
    model = upstream.stream({"type": "error", "error": error})
    with pytest.raises(kind) as caught:
        await collect(backend, ask(model))
    assert caught.value.param == param


@pytest.mark.parametrize(("status", "body", "kind", "param"), [
    (400, {"error": {"type": "invalid_request", "message": "too small", "param": "max_output_tokens"}},
     InvalidRequest, "max_output_tokens"),
    (400, {"error": {"type": "invalid_request", "message": "bad", "param": "input[2]"}}, InvalidRequest, None),
    (404, {"error": {"type": "not_found", "code": "model_not_found", "message": "no model"}}, ModelNotFound, "model"),
    (429, {"error": {"message": "slow"}}, TooManyRequests, None),
    (500, {"error": {"message": "trace"}}, ModelError, None),
])
async def test_http_errors(backend: ResponsesUpstreamBackend, upstream: ScriptedUpstream,
                           status: int, body: dict[str, Any], kind: type, param: str | None) -> None:
    model = upstream.respond(status, body)
    with pytest.raises(kind) as caught:
        await collect(backend, ask(model))
    assert type(caught.value) is kind and caught.value.param == param


async def test_an_unreachable_upstream() -> None:
    adapter = ResponsesUpstreamBackend("http://127.0.0.1:9/v1")
    with pytest.raises(ModelError) as caught:
        await collect(adapter, ask("m"))
    assert caught.value.code == "upstream_unavailable"
    await adapter.aclose()


async def test_items_streamed_without_index_or_id_meet_their_final_form(backend: ResponsesUpstreamBackend,
                                                                        upstream: ScriptedUpstream) -> None:
    model = upstream.stream(
        {"type": "response.output_text.delta", "delta": "Hel"},
        {"type": "response.output_text.delta", "delta": "lo"},
        completed([message("Hello!")]),
    )
    assert joined(await collect(backend, ask(model))) == "Hello!"


async def test_events_after_the_terminal_one_are_ignored(backend: ResponsesUpstreamBackend,
                                                         upstream: ScriptedUpstream) -> None:
    model = upstream.stream(text("Hi"), completed(), text(" again"), DONE)
    assert joined(await collect(backend, ask(model))) == "Hi"


def test_the_body_sent_is_the_payload_with_each_messages_items_made_once() -> None:
    backend = ResponsesUpstreamBackend("http://x/v1")
    history = (ChatMessage(role="system", content="Be brief. «ü»"), ChatMessage(role="user", content="Hi"),
               ChatMessage(role="assistant", content="Let me look.",
                           tool_calls=(ToolCall("c1", "get_weather", '{"city":"Oslo"}'),)),
               ChatMessage(role="tool", content="12 C", tool_call_id="c1"))
    request = replace(ask("m", tools=(WEATHER,)), messages=history)
    kept = backend._input_json[True]  # the model takes images: the messages with their parts
    body = kept.body(backend.payload(request, input=False), "input", request.messages)
    assert json.loads(body) == backend.payload(request)
    assert len(kept) == len(history)
    longer = replace(request, messages=(*history, ChatMessage(role="user", content="And Rome?")))
    spliced = kept.body(backend.payload(longer, input=False), "input", longer.messages)
    assert json.loads(spliced) == backend.payload(longer)
    assert len(kept) == len(history) + 1  # the past messages' items were reused


async def test_a_name_past_64_characters_goes_out_short_and_comes_back_whole(
        backend: ResponsesUpstreamBackend, upstream: ScriptedUpstream) -> None:
    long = "mcp__an_issue_tracker_with_a_rather_long_server_name__create_issue_comment_reply"
    wire = wire_name(long)
    call = {"type": "function_call", "id": "fc1", "call_id": "call_1", "name": wire, "arguments": "{}"}
    model = upstream.stream(added(0, call), done(0, call), completed([call]), DONE)
    replayed = (ChatMessage("user", "hi"), ChatMessage("assistant", "", tool_calls=(ToolCall("call_0", long, "{}"),)),
                ChatMessage("tool", "ok", tool_call_id="call_0"))
    request = GenerationRequest(model=model, messages=replayed, tools=(ToolSpec(name=long), SEARCH),
                                tool_policy=ToolPolicy(mode="required", allowed=(long, "search")))
    deltas = await collect(backend, request)
    assert [d.name for d in deltas if isinstance(d, ToolCallDelta) and d.name] == [long]
    sent = upstream.requests_for(model)[-1].body
    assert [tool["name"] for tool in sent["tools"]] == [wire, "search"] and len(wire) == 64
    assert sent["tool_choice"]["tools"] == [{"type": "function", "name": wire}, {"type": "function", "name": "search"}]
    assert [item["name"] for item in sent["input"] if item["type"] == "function_call"] == [wire]
