from __future__ import annotations

import asyncio

import pytest

from app.backends.base import (
    ChatMessage,
    Delta,
    Finish,
    GenerationRequest,
    ModelInfo,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from app.backends.scripted import Script, ScriptedBackend, text_script, tool_call_script
from app.errors import InvalidRequest, ModelError, ModelNotFound, TooManyRequests

pytestmark = pytest.mark.anyio


def request(model: str = "echo", text: str = "hello there world") -> GenerationRequest:
    return GenerationRequest(model=model, messages=(ChatMessage("user", text),))


async def collect(backend: ScriptedBackend, req: GenerationRequest) -> list[Delta]:
    return [delta async for delta in backend.stream(req)]


async def test_plays_a_fixed_script_and_records_the_request() -> None:
    backend = ScriptedBackend({"echo": text_script("Hel", "lo")})
    req = request()

    deltas = await collect(backend, req)

    assert deltas == [TextDelta("Hel"), TextDelta("lo"), Finish("stop", Usage(input_tokens=3, output_tokens=2))]
    assert backend.requests == [req]
    assert backend.cancelled == []


async def test_appends_a_finish_when_the_script_has_none() -> None:
    backend = ScriptedBackend({"echo": [ReasoningDelta("hmm"), TextDelta("ok")]})

    assert (await collect(backend, request()))[-1] == Finish("stop", Usage(input_tokens=3, output_tokens=2))


async def test_keeps_a_finish_that_carries_its_own_usage() -> None:
    finish = Finish("length", Usage(input_tokens=7, output_tokens=9))
    backend = ScriptedBackend({"echo": [TextDelta("x"), finish]})

    assert (await collect(backend, request()))[-1] == finish


async def test_a_script_function_sees_the_request() -> None:
    def echo(req: GenerationRequest) -> list[Delta]:
        return text_script(req.messages[-1].content.upper())

    backend = ScriptedBackend({"echo": echo})

    assert (await collect(backend, request(text="shout")))[0] == TextDelta("SHOUT")


async def test_an_async_script_function_is_awaited() -> None:
    async def later(req: GenerationRequest) -> list[Delta]:
        await asyncio.sleep(0)
        return text_script("done")

    assert (await collect(ScriptedBackend({"echo": later}), request()))[0] == TextDelta("done")


async def test_a_script_function_may_refuse() -> None:
    def refuse(req: GenerationRequest) -> list[Delta]:
        raise TooManyRequests("slow down")

    backend = ScriptedBackend({"echo": refuse})

    with pytest.raises(TooManyRequests):
        await collect(backend, request())
    assert len(backend.requests) == 1


async def test_fails_mid_stream_after_n_deltas() -> None:
    backend = ScriptedBackend(
        {"echo": Script(text_script("a", "b", "c"), fail_after=2, error=InvalidRequest("bad", param="input"))}
    )
    seen: list[Delta] = []

    with pytest.raises(InvalidRequest):
        async for delta in backend.stream(request()):
            seen.append(delta)
    assert seen == [TextDelta("a"), TextDelta("b")]


async def test_default_mid_stream_failure_is_a_model_error() -> None:
    backend = ScriptedBackend({"echo": Script(text_script("a"), fail_after=0)})

    with pytest.raises(ModelError):
        await collect(backend, request())


async def test_delay_paces_the_deltas_and_cancellation_is_recorded() -> None:
    backend = ScriptedBackend({"slow": Script(text_script(*"abcdefghij"), delay=0.05)})
    req = request("slow")
    stream = backend.stream(req)

    assert await anext(stream) == TextDelta("a")
    await stream.aclose()

    assert backend.cancelled == [req]


async def test_task_cancellation_during_a_delay_is_recorded() -> None:
    backend = ScriptedBackend({"slow": Script(text_script("a", "b"), delay=10)})
    req = request("slow")
    task = asyncio.create_task(collect(backend, req))
    await asyncio.sleep(0.01)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert backend.cancelled == [req]


async def test_tool_call_script_names_the_call_once() -> None:
    deltas = tool_call_script("get_weather", '{"city": "Paris"}', call_id="call_1", pieces=3)

    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert calls[0].name == "get_weather" and calls[0].call_id == "call_1"
    assert all(d.name is None and d.call_id is None for d in calls[1:])
    assert "".join(d.arguments for d in calls) == '{"city": "Paris"}'
    assert deltas[-1] == Finish("tool_calls")


async def test_serves_only_its_models() -> None:
    backend = ScriptedBackend({"echo": text_script("x")})

    assert backend.serves("echo") and not backend.serves("other")
    assert backend.models() == [ModelInfo(id="echo", owned_by="scripted")]
    with pytest.raises(ModelNotFound):
        await collect(backend, request("other"))
