from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from app.backends.base import (
    ChatMessage,
    Delta,
    Finish,
    GenerationRequest,
    OutputFormat,
    Sampling,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
)
from app.backends.local import LocalBackend
from app.backends.local_completion import PlainTextParser
from app.backends.model_files import ModelFiles, ModelSpec
from app.errors import ContextLengthExceeded, InvalidRequest, ModelError, ModelNotFound, TooManyRequests

SMOLLM2 = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-1.5b-instruct"

pytestmark = [pytest.mark.anyio, pytest.mark.model]

PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def ask(
    text: str,
    *,
    model: str = SMOLLM2,
    max_tokens: int | None = 16,
    temperature: float | None = 0.0,
    output_format: OutputFormat | None = None,
) -> GenerationRequest:
    return GenerationRequest(
        model=model,
        messages=(ChatMessage("user", text),),
        sampling=Sampling(temperature=temperature, max_output_tokens=max_tokens),
        output_format=output_format or OutputFormat(),
    )


async def collect(backend: LocalBackend, request: GenerationRequest) -> list[Delta]:
    return [delta async for delta in backend.stream(request)]


def text_of(deltas: list[Delta]) -> str:
    return "".join(delta.text for delta in deltas if isinstance(delta, TextDelta))


async def idle_slots(backend: LocalBackend, model: str = SMOLLM2, deadline: float = 60) -> list[dict[str, Any]]:
    """llama-server's slots once it reports every one idle (it notices a closed connection
    at its next token), with no slot held here either; fails past ``deadline`` seconds, a
    bound, not a measurement."""
    pool = backend.slot_pool(model)
    assert pool is not None and pool.busy == 0
    url = backend.server_url(model)
    assert url is not None
    async with asyncio.timeout(deadline), httpx.AsyncClient(base_url=url, headers=backend.server_headers(model)) as client:
        while True:
            slots: list[dict[str, Any]] = (await client.get("/slots")).json()
            if not any(slot["is_processing"] for slot in slots):
                return slots
            await asyncio.sleep(0.05)


def cut_short(slots: list[dict[str, Any]]) -> bool:
    """Whether a slot's last generation was stopped from outside: llama-server clears
    ``has_next_token`` when a generation ends by itself (an end token, its budget), and
    leaves it set when the generation is cancelled."""
    return any(slot["next_token"][0]["has_next_token"] for slot in slots if "next_token" in slot)


async def test_streams_text_deltas_then_exactly_one_finish(smollm2: LocalBackend) -> None:
    request = ask("What is the capital of France?", max_tokens=24)
    deltas = await collect(smollm2, request)

    *content, finish = deltas
    assert content and all(isinstance(d, TextDelta) and d.text for d in content)
    assert isinstance(finish, Finish) and finish.usage is not None
    assert finish.usage.input_tokens == await smollm2.count_tokens(SMOLLM2, request.messages)
    assert 1 <= finish.usage.output_tokens <= 24
    assert text_of(deltas).strip()


async def test_llama_server_is_reached_directly_whatever_the_proxy_variables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client of the model's llama-server reads nothing of the environment: with every
    proxy variable pointing at a port where nothing listens (and no NO_PROXY), the model
    still starts, answers, and saves its slots."""
    nowhere = "http://127.0.0.1:9"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, nowhere)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    backend = LocalBackend(tmp_path, n_threads=2, models=[SMOLLM2], preload=[SMOLLM2])
    await backend.start()
    try:
        deltas = await collect(backend, ask("Say hello.", max_tokens=8))
        assert isinstance(deltas[-1], Finish) and text_of(deltas)
    finally:
        await backend.aclose()
    assert list((tmp_path / "kv" / SMOLLM2).glob("slot-*.bin"))  # saved at close, through the same client


async def test_small_max_output_tokens_finishes_with_length(smollm2: LocalBackend) -> None:
    deltas = await collect(smollm2, ask("Write a long story about a dragon.", max_tokens=5))

    finish = deltas[-1]
    assert isinstance(finish, Finish) and finish.reason == "length"
    assert finish.usage is not None and finish.usage.output_tokens == 5


async def test_natural_end_finishes_with_stop(smollm2: LocalBackend) -> None:
    deltas = await collect(smollm2, ask("Say hello.", max_tokens=200))

    finish = deltas[-1]
    assert isinstance(finish, Finish) and finish.reason == "stop"
    assert finish.usage is not None and finish.usage.output_tokens < 200


async def test_json_schema_output_parses_and_matches(smollm2: LocalBackend) -> None:
    schema = OutputFormat(kind="json_schema", name="person", schema=PERSON_SCHEMA, strict=True)
    deltas = await collect(smollm2, ask("Describe a person as JSON.", max_tokens=64, output_format=schema))

    assert isinstance(deltas[-1], Finish) and deltas[-1].reason == "stop"
    jsonschema.validate(json.loads(text_of(deltas)), PERSON_SCHEMA)


async def test_json_object_output_parses(smollm2: LocalBackend) -> None:
    deltas = await collect(
        smollm2, ask("Give a JSON object with a greeting.", max_tokens=64, output_format=OutputFormat(kind="json_object"))
    )

    assert isinstance(json.loads(text_of(deltas)), dict)


async def test_unsupported_schema_is_rejected_before_generation(smollm2: LocalBackend) -> None:
    schema = {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}
    request = ask("Anything.", output_format=OutputFormat(kind="json_schema", name="x", schema=schema))

    with pytest.raises(InvalidRequest) as raised:
        await collect(smollm2, request)
    assert raised.value.param == "text.format.schema"
    assert "schema" in raised.value.message
    pool = smollm2.slot_pool(SMOLLM2)
    assert pool is not None and pool.busy == 0


async def test_unknown_model_is_not_found(smollm2: LocalBackend) -> None:
    with pytest.raises(ModelNotFound):
        await collect(smollm2, ask("Hi", model="no-such-model"))


async def test_prompt_beyond_the_context_window_is_rejected(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, n_threads=2, n_ctx=64, models=[SMOLLM2])
    try:
        with pytest.raises(ContextLengthExceeded) as raised:
            await collect(backend, ask("word " * 200))
        assert raised.value.code == "context_length_exceeded"
        assert await collect(backend, ask("Hi", max_tokens=4))
    finally:
        await backend.aclose()


async def test_output_is_capped_by_the_context_window(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, n_threads=2, n_ctx=48, models=[SMOLLM2])
    try:
        request = ask("Write a long story about a dragon.", max_tokens=None, temperature=None)
        finish = (await collect(backend, request))[-1]
        assert isinstance(finish, Finish) and finish.usage is not None
        assert finish.usage.input_tokens + finish.usage.output_tokens <= 48
    finally:
        await backend.aclose()


async def test_model_loads_lazily_on_first_use(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, n_threads=2, models=[SMOLLM2])
    try:
        assert [m.id for m in backend.models()] == [SMOLLM2]
        assert backend.context_window(SMOLLM2) == 8192
        assert isinstance((await collect(backend, ask("Hi", max_tokens=4)))[-1], Finish)
    finally:
        await backend.aclose()


async def test_concurrent_generations_on_one_model_run_together(smollm2: LocalBackend) -> None:
    happened: list[tuple[str, str]] = []  # (stream, "first" or "end"), in the order they happened

    async def run(name: str, prompt: str) -> list[Delta]:
        deltas: list[Delta] = []
        async for delta in smollm2.stream(ask(prompt, max_tokens=24)):
            if not deltas:
                happened.append((name, "first"))
            deltas.append(delta)
        happened.append((name, "end"))
        return deltas

    essay = "Write a very long essay about the history of Rome, at least 5000 words."  # runs to its budget
    one, two = await asyncio.gather(run("one", essay), run("two", f"{essay} Begin with the Republic."))

    for deltas in (one, two):
        assert isinstance(deltas[-1], Finish) and sum(isinstance(d, Finish) for d in deltas) == 1
    # the second streamed before the first had finished: one batch, two slots
    first_name = happened[0][0]
    second_name = "two" if first_name == "one" else "one"
    assert happened.index((second_name, "first")) < happened.index((first_name, "end")), happened


async def test_closing_the_stream_stops_the_worker_and_frees_the_model(smollm2: LocalBackend) -> None:
    stream = smollm2.stream(ask("Write a long story about a dragon.", max_tokens=400, temperature=0.8))
    for _ in range(3):
        assert isinstance(await anext(stream), TextDelta)

    await asyncio.wait_for(stream.aclose(), timeout=60)
    assert cut_short(await idle_slots(smollm2))  # stopped, not run to its end

    deltas = await collect(smollm2, ask("Say hello.", max_tokens=8))
    assert isinstance(deltas[-1], Finish)


async def test_cancelling_the_consumer_stops_the_worker(smollm2: LocalBackend) -> None:
    received = asyncio.Event()

    async def consume() -> None:
        async for delta in smollm2.stream(ask("Write a long story about a dragon.", max_tokens=400, temperature=0.8)):
            if isinstance(delta, TextDelta):
                received.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(received.wait(), timeout=60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=60)
    assert cut_short(await idle_slots(smollm2))  # stopped, not run to its end

    deltas = await collect(smollm2, ask("Say hello.", max_tokens=8))
    assert isinstance(deltas[-1], Finish)


async def test_event_loop_stays_responsive_during_generation(smollm2: LocalBackend) -> None:
    """The loop runs other tasks while a generation waits for its tokens: a task that
    wakes every millisecond runs between most two deltas. (Were the tokens made on the
    loop, or read from a blocking socket, it would run between none of them.)"""
    turns = 0
    done = asyncio.Event()

    async def other_task() -> None:
        nonlocal turns
        while not done.is_set():
            await asyncio.sleep(0.001)
            turns += 1

    running = asyncio.create_task(other_task())
    deltas: list[Delta] = []
    seen: list[int] = []  # the other task's turns when each delta arrived
    try:
        async for delta in smollm2.stream(ask("Write a long story about a dragon.", max_tokens=128, temperature=0.8)):
            deltas.append(delta)
            seen.append(turns)
    finally:
        done.set()
        await running

    assert isinstance(deltas[-1], Finish)
    between = [later - earlier for earlier, later in zip(seen, seen[1:], strict=False)]
    assert sum(1 for count in between if count > 0) >= len(between) // 2, between


async def test_split_characters_are_never_emitted_broken(smollm2: LocalBackend) -> None:
    deltas = await collect(smollm2, ask("Repeat exactly: 🙂 🎉 😀", max_tokens=48))

    assert "\ufffd" not in text_of(deltas)


async def test_logprobs_come_with_the_text_of_their_tokens_only_when_asked(smollm2: LocalBackend) -> None:
    """Emojis are several tokens each; every delta still carries exactly its tokens."""
    prompt = "Repeat exactly: 🙂 🎉 café"
    asked = ask(prompt, max_tokens=32)
    asked = replace(asked, sampling=replace(asked.sampling, logprobs=True, top_logprobs=2))
    texts = [d for d in await collect(smollm2, asked) if isinstance(d, TextDelta)]
    assert texts
    for delta in texts:
        assert delta.logprobs and "".join(t.token for t in delta.logprobs) == delta.text
        assert all(t.logprob <= 0 and len(t.top) == 2 and t.top[0].logprob >= t.top[1].logprob for t in delta.logprobs)
    assert b"".join(t.token_bytes for d in texts for t in d.logprobs) == "".join(d.text for d in texts).encode()

    plain = await collect(smollm2, ask(prompt, max_tokens=32))
    assert all(d.logprobs == () for d in plain if isinstance(d, TextDelta))


async def test_the_output_parser_decides_what_the_text_means(tmp_path: Path) -> None:
    class CallAtTheEnd(PlainTextParser):
        def feed(self, text: str) -> list[Delta]:
            return []

        def close(self) -> list[Delta]:
            return [ToolCallDelta(index=0, name="get_weather", call_id="call_1", arguments="{}")]

    def parser(request: GenerationRequest, spec: ModelSpec) -> CallAtTheEnd:
        return CallAtTheEnd()

    backend = LocalBackend(tmp_path, n_threads=2, models=[SMOLLM2], output_parser=parser)
    try:
        deltas = await collect(backend, ask("Say hello.", max_tokens=200))
    finally:
        await backend.aclose()

    assert deltas[0] == ToolCallDelta(index=0, name="get_weather", call_id="call_1", arguments="{}")
    assert isinstance(deltas[1], Finish) and deltas[1].reason == "tool_calls" and len(deltas) == 2


async def test_a_failed_load_is_reported_and_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_path = ModelFiles.path
    attempts: list[str] = []

    def flaky_path(self: ModelFiles, model_id: str) -> Path:
        attempts.append(model_id)
        if len(attempts) == 1:
            raise ModelError("not installed", code="model_unavailable")
        return real_path(self, model_id)

    monkeypatch.setattr(ModelFiles, "path", flaky_path)
    backend = LocalBackend(tmp_path, n_threads=2, models=[SMOLLM2])
    try:
        with pytest.raises(ModelError, match="not installed"):
            await collect(backend, ask("Hi", max_tokens=4))
        assert isinstance((await collect(backend, ask("Hi", max_tokens=4)))[-1], Finish)
    finally:
        await backend.aclose()
    assert attempts == [SMOLLM2, SMOLLM2]


async def test_count_tokens_grows_with_the_conversation(smollm2: LocalBackend) -> None:
    short = (ChatMessage("user", "Hi"),)
    longer = (*short, ChatMessage("assistant", "Hello! How can I help?"), ChatMessage("user", "Tell me a joke."))

    assert 0 < await smollm2.count_tokens(SMOLLM2, short) < await smollm2.count_tokens(SMOLLM2, longer)


@pytest.mark.slow
async def test_qwen_renders_tools_and_answers(qwen_cache_dir: Path) -> None:
    backend = LocalBackend(qwen_cache_dir, n_threads=2, models=[QWEN])
    try:
        weather = ToolSpec(
            name="get_weather",
            description="Current weather for a city",
            parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        )
        messages = (ChatMessage("user", "What is 17 * 3? Answer with the number only."),)
        with_tools = await backend.count_tokens(QWEN, messages, (weather,))
        assert with_tools > await backend.count_tokens(QWEN, messages) + 50

        deltas = await collect(backend, ask(messages[0].content, model=QWEN, max_tokens=8))

        assert "51" in text_of(deltas)
        finish = deltas[-1]
        assert isinstance(finish, Finish) and finish.usage is not None and finish.usage.output_tokens <= 8
    finally:
        await backend.aclose()


# ---------------------------------------------------------------- slots, queue, prompt cache


async def test_beyond_the_slots_requests_wait_in_order_and_beyond_the_queue_get_429(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, n_threads=2, models=[SMOLLM2], preload=[SMOLLM2], parallel=1, queue=1)
    await backend.start()
    try:
        long = backend.stream(ask("Write a very long essay about the history of Rome, at least 5000 words.",
                                  max_tokens=4000))
        assert isinstance(await anext(long), TextDelta)  # holds the only slot
        finished: list[str] = []

        async def waiter() -> None:
            await collect(backend, ask("Say hi.", max_tokens=4))
            finished.append("waiter")

        waiting = asyncio.create_task(waiter())
        pool = backend.slot_pool(SMOLLM2)
        assert pool is not None
        async with asyncio.timeout(60):  # a bound, not a measurement
            while pool.waiting != 1:
                await asyncio.sleep(0.01)
        with pytest.raises(TooManyRequests) as refused:
            await backend.check(ask("One more."))
        assert refused.value.status == 429 and refused.value.type == "too_many_requests"
        with pytest.raises(TooManyRequests):
            await collect(backend, ask("One more."))
        assert not finished
        await long.aclose()  # the slot goes to the waiter
        await asyncio.wait_for(waiting, timeout=30)
        assert finished == ["waiter"]
    finally:
        await backend.aclose()


async def test_a_shared_prefix_is_reused_and_reported_as_cached(smollm2: LocalBackend) -> None:
    preamble = "You are a careful assistant. " * 60  # a long shared system prompt
    first = await collect(smollm2, GenerationRequest(
        model=SMOLLM2, messages=(ChatMessage("system", preamble), ChatMessage("user", "Name a colour.")),
        sampling=Sampling(max_output_tokens=8, temperature=0.0)))
    second = await collect(smollm2, GenerationRequest(
        model=SMOLLM2, messages=(ChatMessage("system", preamble), ChatMessage("user", "Name a fruit.")),
        sampling=Sampling(max_output_tokens=8, temperature=0.0)))
    cold, warm = first[-1], second[-1]
    assert isinstance(cold, Finish) and isinstance(warm, Finish)
    assert cold.usage is not None and warm.usage is not None
    assert cold.usage.cached_tokens == 0
    # everything up to the user message is shared: at least the whole preamble is reused
    assert warm.usage.input_tokens - 20 <= warm.usage.cached_tokens < warm.usage.input_tokens
    assert warm.usage.cached_tokens > 300


async def test_the_prompt_cache_survives_a_restart(tmp_path: Path) -> None:
    preamble = "Answer in one word. " * 60
    request = GenerationRequest(model=SMOLLM2, messages=(ChatMessage("system", preamble), ChatMessage("user", "Hi")),
                                sampling=Sampling(max_output_tokens=4, temperature=0.0))
    before = LocalBackend(tmp_path, n_threads=2, models=[SMOLLM2], preload=[SMOLLM2])
    await before.start()
    try:
        assert (await collect(before, request))[-1].usage.cached_tokens == 0  # type: ignore[union-attr]
    finally:
        await before.aclose()  # saves the slots
    after = LocalBackend(tmp_path, n_threads=2, models=[SMOLLM2], preload=[SMOLLM2])
    await after.start()
    try:
        finish = (await collect(after, request))[-1]
        assert isinstance(finish, Finish) and finish.usage is not None
        assert finish.usage.cached_tokens >= finish.usage.input_tokens - 1
    finally:
        await after.aclose()


async def test_alternating_conversations_each_find_their_prefix(smollm2: LocalBackend) -> None:
    """Two conversations alternate; each keeps finding its own prefix (moved out of its
    slot into the host-memory cache when the other starts, and loaded back). A
    ``prompt_cache_key`` is accepted and changes nothing: the cache is found by content."""
    first = "You are a pirate. " * 50
    second = "You are a librarian. " * 50

    async def turn(preamble: str, key: str) -> Finish:
        deltas = await collect(smollm2, GenerationRequest(
            model=SMOLLM2, messages=(ChatMessage("system", preamble), ChatMessage("user", "Hello")),
            sampling=Sampling(max_output_tokens=4, temperature=0.0), cache_key=key))
        assert isinstance(deltas[-1], Finish)
        return deltas[-1]

    await turn(first, "pirate")
    await turn(second, "librarian")
    for preamble, key in ((first, "pirate"), (second, "librarian")):
        finish = await turn(preamble, key)
        assert finish.usage is not None and finish.usage.cached_tokens >= finish.usage.input_tokens - 1


def preambled(preamble: str, question: str, max_tokens: int = 4) -> GenerationRequest:
    return GenerationRequest(model=SMOLLM2, messages=(ChatMessage("system", preamble), ChatMessage("user", question)),
                             sampling=Sampling(max_output_tokens=max_tokens, temperature=0.0))


async def test_a_prompt_that_needs_the_whole_window_leaves_other_conversations_cached(tmp_path: Path) -> None:
    """Three conversations, then a prompt that needs nearly the whole (shared) window: it
    runs (the idle slots were moved to the host-memory cache and take no room in the
    window), and the conversations still find their prefixes afterwards. The first of
    them may not: llama-server loads a prefix into a slot before it moves the idle slots
    out, and the long prompt's slot still fills the window then."""
    backend = LocalBackend(tmp_path, n_threads=2, n_ctx=2048, models=[SMOLLM2], preload=[SMOLLM2])
    await backend.start()
    try:
        preambles = [f"You are helper number {k}, who likes the colour {colour}. " * 30
                     for k, colour in enumerate(("red", "green", "blue"))]
        for preamble in preambles:
            await collect(backend, preambled(preamble, "Hello"))
        words = " ".join(random.choice(["alpha", "beta", "gamma", "delta", "kappa", "omega"]) for _ in range(1500))
        finish = (await collect(backend, preambled("Answer briefly.", f"{words}\nSay yes.", max_tokens=16)))[-1]
        assert isinstance(finish, Finish) and finish.usage is not None
        assert 1500 < finish.usage.input_tokens < 2048 - 16 and finish.usage.output_tokens > 0
        for number, preamble in enumerate(preambles):
            finish = (await collect(backend, preambled(preamble, "Hello again")))[-1]
            assert isinstance(finish, Finish) and finish.usage is not None and finish.usage.output_tokens > 0
            if number:
                assert finish.usage.cached_tokens > 300, finish.usage
    finally:
        await backend.aclose()
