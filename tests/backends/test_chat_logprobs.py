"""Logprobs through the Chat Completions backend, against the scripted upstream (the real
llama-cpp-python upstream is exercised end to end in ``tests/e2e/test_upstream.py``)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from app.backends.base import ChatMessage, Delta, Finish, GenerationRequest, Sampling, TextDelta, TokenLogprob
from app.backends.chat_completions import ChatCompletionsBackend
from app.errors import InvalidRequest
from tests.upstream_server import DONE, ScriptedUpstream, chunk, running_scripted_upstream

pytestmark = pytest.mark.anyio


def ask(model: str, *, logprobs: bool = True, top_logprobs: int = 2) -> GenerationRequest:
    return GenerationRequest(
        model=model,
        messages=(ChatMessage("user", "Say hello."),),
        sampling=Sampling(logprobs=logprobs, top_logprobs=top_logprobs),
    )


def entry(
    token: str, logprob: float, top: list[tuple[str, float]] | None = None, raw: list[int] | None = None
) -> dict[str, Any]:
    """A ``logprobs.content[]`` entry; ``raw=None`` sends ``bytes: null`` (llama-cpp-python)."""
    return {
        "token": token,
        "logprob": logprob,
        "bytes": raw,
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in top or []],
    }


def with_logprobs(body: dict[str, Any], *entries: dict[str, Any]) -> dict[str, Any]:
    body["choices"][0]["logprobs"] = {"content": list(entries), "refusal": None}
    return body


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with running_scripted_upstream() as scripted:
        yield scripted


@pytest.fixture
async def backend(upstream: ScriptedUpstream) -> AsyncIterator[ChatCompletionsBackend]:
    chat = ChatCompletionsBackend(upstream.base_url)
    await chat.start()
    yield chat
    await chat.aclose()


async def collect(backend: ChatCompletionsBackend, request: GenerationRequest) -> list[Delta]:
    return [delta async for delta in backend.stream(request)]


def test_logprobs_are_asked_only_when_wanted() -> None:
    chat = ChatCompletionsBackend("http://127.0.0.1:9/v1")
    asked = chat.payload(ask("m", top_logprobs=3))
    assert (asked["logprobs"], asked["top_logprobs"]) == (True, 3)
    assert chat.payload(ask("m", top_logprobs=0))["top_logprobs"] == 0
    plain = chat.payload(ask("m", logprobs=False))
    assert "logprobs" not in plain and "top_logprobs" not in plain


async def test_chunk_logprobs_go_on_their_text_deltas(backend: ChatCompletionsBackend, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(
        with_logprobs(chunk(content="Hi"), entry("Hi", -0.5, [("Hello", -0.2), ("Hi", -0.5), ("Hey", -1.0)])),
        with_logprobs(chunk(content=""), entry("", -0.1, raw=[0xC3])),  # completes no character
        with_logprobs(chunk(content="é"), entry("é", -0.3, raw=[0xA9])),
        chunk(finish_reason="stop"),
        DONE,
    )
    deltas = await collect(backend, ask(model, top_logprobs=2))
    assert deltas[:-1] == [
        TextDelta("Hi", (TokenLogprob("Hi", -0.5, b"Hi", (TokenLogprob("Hello", -0.2, b"Hello"),
                                                           TokenLogprob("Hi", -0.5, b"Hi"))),)),
        TextDelta("é", (TokenLogprob("", -0.1, b"\xc3"), TokenLogprob("é", -0.3, b"\xa9"))),
    ]  # fmt: skip
    assert isinstance(deltas[-1], Finish)


async def test_logprobs_not_asked_are_ignored(backend: ChatCompletionsBackend, upstream: ScriptedUpstream) -> None:
    model = upstream.stream(with_logprobs(chunk(content="Hi"), entry("Hi", -0.5)), chunk(finish_reason="stop"), DONE)
    deltas = await collect(backend, ask(model, logprobs=False))
    assert deltas[0] == TextDelta("Hi") and deltas[0].logprobs == ()


async def test_an_upstream_that_sends_none_is_logged_once(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    model = upstream.stream(chunk(content="Hi"), chunk(content=" there"), chunk(finish_reason="stop"), DONE)
    with caplog.at_level(logging.WARNING):
        deltas = await collect(backend, ask(model))
    assert [d for d in deltas if isinstance(d, TextDelta)] == [TextDelta("Hi"), TextDelta(" there")]
    assert len([r for r in caplog.records if "sent no logprobs" in r.getMessage()]) == 1


async def test_an_upstream_refusing_logprobs_is_the_clients_include(
    backend: ChatCompletionsBackend, upstream: ScriptedUpstream
) -> None:
    model = upstream.respond(400, {"error": {"message": "logprobs are not supported with this model"}})
    with pytest.raises(InvalidRequest) as refused:
        await collect(backend, ask(model))
    assert refused.value.param == "include" and refused.value.code == "upstream_rejected"
    assert "logprobs are not supported" in refused.value.message

    other = upstream.respond(400, {"error": {"message": "temperature is out of range"}})
    with pytest.raises(InvalidRequest) as unrelated:
        await collect(backend, ask(other))
    assert unrelated.value.param is None
