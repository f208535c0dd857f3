"""The tool policy holds whatever a backend produces."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from app.backends.base import (
    ChatMessage,
    Delta,
    Finish,
    GenerationRequest,
    TextDelta,
    ToolCallDelta,
    ToolPolicy,
    ToolSpec,
)
from app.engine.tools import enforce_tool_policy
from app.errors import ModelError

TOOLS = (ToolSpec("get_weather"), ToolSpec("search"), ToolSpec("delete_everything"))


async def _source(deltas: Sequence[Delta]) -> AsyncIterator[Delta]:
    for delta in deltas:
        yield delta


async def _run(deltas: Sequence[Delta], policy: ToolPolicy) -> list[Delta]:
    request = GenerationRequest(model="m", messages=(ChatMessage("user", "x"),), tools=TOOLS, tool_policy=policy)
    return [delta async for delta in enforce_tool_policy(_source(deltas), request)]


def _calls(deltas: list[Delta]) -> list[tuple[str | None, str]]:
    return [(d.name, d.arguments) for d in deltas if isinstance(d, ToolCallDelta)]


def _call(index: int, name: str, *pieces: str) -> list[Delta]:
    first, *rest = pieces or ("",)
    return [ToolCallDelta(index, name=name, arguments=first), *[ToolCallDelta(index, arguments=p) for p in rest]]


@pytest.mark.anyio
async def test_a_call_is_released_whole() -> None:
    out = await _run([TextDelta("ok "), *_call(0, "get_weather", '{"city"', ': "Paris"}'), Finish("tool_calls")],
                     ToolPolicy())
    assert _calls(out) == [("get_weather", '{"city": "Paris"}')]
    assert isinstance(out[-1], Finish) and out[-1].reason == "tool_calls"


@pytest.mark.anyio
async def test_unknown_and_disallowed_tools_are_suppressed() -> None:
    deltas = [*_call(0, "not_offered", "{}"), *_call(1, "delete_everything", "{}"), *_call(2, "search", "{}"),
              Finish("tool_calls")]
    out = await _run(deltas, ToolPolicy(allowed=("get_weather", "search")))
    assert _calls(out) == [("search", "{}")]


@pytest.mark.anyio
async def test_none_lets_no_call_through() -> None:
    out = await _run([*_call(0, "get_weather", "{}"), Finish("tool_calls")], ToolPolicy(mode="none"))
    assert _calls(out) == [] and out[-1] == Finish("stop")


@pytest.mark.anyio
async def test_bad_arguments_are_suppressed() -> None:
    deltas = [*_call(0, "get_weather", '{"city": '), *_call(1, "search", "[1, 2]"), *_call(2, "search", '{"q": 1}'),
              Finish("tool_calls")]
    assert _calls(await _run(deltas, ToolPolicy())) == [("search", '{"q": 1}')]


@pytest.mark.anyio
async def test_parallel_false_and_max_calls() -> None:
    deltas = [*_call(0, "search", "{}"), *_call(1, "get_weather", "{}"), *_call(2, "search", "{}"),
              Finish("tool_calls")]
    assert len(_calls(await _run(deltas, ToolPolicy(parallel=False)))) == 1
    assert len(_calls(await _run(deltas, ToolPolicy(max_calls=2)))) == 2


@pytest.mark.anyio
async def test_required_without_a_call_fails() -> None:
    with pytest.raises(ModelError) as caught:
        await _run([TextDelta("no"), Finish("stop")], ToolPolicy(mode="required"))
    assert caught.value.code == "tool_call_missing"


@pytest.mark.anyio
async def test_required_with_the_budget_spent_before_any_call_is_no_failure() -> None:
    for reason in ("length", "content_filter"):
        out = await _run([Finish(reason)], ToolPolicy(mode="required"))  # type: ignore[arg-type]
        assert out == [Finish(reason)]  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_call_cut_short_by_the_budget_is_released_as_written() -> None:
    out = await _run([*_call(0, "get_weather", '{"city": "Pa'), Finish("length")], ToolPolicy(mode="required"))
    assert _calls(out) == [("get_weather", '{"city": "Pa')]
    assert out[-1] == Finish("length")
    out = await _run([*_call(0, "get_weather"), Finish("length")], ToolPolicy(mode="required"))
    assert _calls(out) == [("get_weather", "")]


@pytest.mark.anyio
async def test_a_call_cut_short_is_still_held_to_the_policy() -> None:
    deltas = [*_call(0, "delete_everything", '{"really": tr'), Finish("length")]
    out = await _run(deltas, ToolPolicy(allowed=("get_weather",)))
    assert _calls(out) == [] and out[-1] == Finish("length")


@pytest.mark.anyio
async def test_calls_are_renumbered_after_suppression() -> None:
    deltas = [*_call(0, "nope", "{}"), *_call(1, "search", "{}"), *_call(2, "get_weather", "{}"), Finish("tool_calls")]
    indexes = [d.index for d in await _run(deltas, ToolPolicy()) if isinstance(d, ToolCallDelta)]
    assert indexes == [0, 1]
