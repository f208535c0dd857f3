"""Tool calling on the embedded backend with the real models.

SmolLM2 cannot call tools on its own, so its tests exercise the forcing grammar and the
policy; Qwen is used (``slow``) only where the model must decide by itself.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

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
    ToolCall,
    ToolCallDelta,
    ToolPolicy,
    ToolSpec,
)
from app.backends.grammar import BARE_CALL_TRIGGER
from app.backends.local import LocalBackend
from app.backends.local_completion import completion_body, make_plan
from app.backends.model_files import LOCAL_MODELS, ModelFiles
from app.backends.toolcalls import ToolCallParser
from app.backends.vocabulary import Vocabulary
from app.errors import InvalidRequest

SMOLLM2 = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-1.5b-instruct"

pytestmark = pytest.mark.anyio

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)
SEARCH = ToolSpec(
    name="search_web",
    description="Search the web",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
TIME = ToolSpec(
    name="get_time",
    description="Current time in a time zone",
    parameters={"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
)
TOOLS = (WEATHER, SEARCH, TIME)
SCHEMAS = {tool.name: tool.parameters for tool in TOOLS}


def ask(
    *messages: ChatMessage | str,
    model: str = SMOLLM2,
    policy: ToolPolicy | None = None,
    tools: tuple[ToolSpec, ...] = TOOLS,
    max_tokens: int = 80,
    temperature: float | None = 0.0,
) -> GenerationRequest:
    return GenerationRequest(
        model=model,
        messages=tuple(ChatMessage("user", m) if isinstance(m, str) else m for m in messages),
        tools=tools,
        tool_policy=policy or ToolPolicy(),
        sampling=Sampling(temperature=temperature, max_output_tokens=max_tokens),
    )


async def collect(backend: LocalBackend, request: GenerationRequest) -> list[Delta]:
    return [delta async for delta in backend.stream(request)]


def calls_of(deltas: list[Delta]) -> list[ToolCallDelta]:
    return [delta for delta in deltas if isinstance(delta, ToolCallDelta)]


def text_of(deltas: list[Delta]) -> str:
    return "".join(delta.text for delta in deltas if isinstance(delta, TextDelta))


def record_raw_text(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the model writes, before the parser reads it."""
    pieces: list[str] = []
    feed = ToolCallParser.feed

    def recording(self: ToolCallParser, text: str) -> list[Delta]:
        pieces.append(text)
        return feed(self, text)

    monkeypatch.setattr(ToolCallParser, "feed", recording)
    return pieces


def assert_valid_calls(deltas: list[Delta], cut_short: bool = False) -> list[ToolCallDelta]:
    """Calls only, each matching its tool's schema, numbered from 0; then a ``tool_calls``
    finish, or ``length`` if the model may run out of tokens while writing one more: the
    last call then carries its arguments as far as they got (the engine closes it
    ``incomplete``) and only the calls before it must be whole."""
    calls = calls_of(deltas)
    assert calls and len(calls) + 1 == len(deltas)
    finish = deltas[-1]
    assert isinstance(finish, Finish) and finish.reason in (("tool_calls", "length") if cut_short else ("tool_calls",))
    for index, call in enumerate(calls):
        assert call.index == index and call.name in SCHEMAS
        if finish.reason == "length" and index == len(calls) - 1:
            continue  # the call generation stopped in: its arguments are as far as they got
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    return calls


async def test_required_forces_a_valid_call_even_from_a_tiny_model(
    smollm2: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = record_raw_text(monkeypatch)
    request = ask("Hello there!", tools=(WEATHER,), policy=ToolPolicy(mode="required", parallel=False))
    deltas = await collect(smollm2, request)

    [call] = assert_valid_calls(deltas)
    assert json.loads(call.arguments)["unit"] in ("celsius", "fahrenheit")
    assert "".join(raw).startswith('{"name": "get_weather", "arguments": {')


async def test_a_named_function_is_called_once(smollm2: LocalBackend) -> None:
    policy = ToolPolicy(mode="required", allowed=("get_time",))
    deltas = await collect(smollm2, ask("What's the weather like in Paris?", policy=policy))

    [call] = assert_valid_calls(deltas)
    assert call.name == "get_time"


@pytest.mark.parametrize(
    "prompt",
    ["What's the weather like in Paris?", "Search the web for news about the James Webb telescope.", "Hello!"],
)
async def test_allowed_tools_required_calls_only_allowed_tools(smollm2: LocalBackend, prompt: str) -> None:
    policy = ToolPolicy(mode="required", allowed=("search_web", "get_time"), max_calls=2)
    deltas = await collect(smollm2, ask(prompt, policy=policy, max_tokens=160, temperature=0.8))

    for call in assert_valid_calls(deltas, cut_short=True):
        assert call.name in ("search_web", "get_time")


async def test_max_tool_calls_bounds_the_forced_calls(smollm2: LocalBackend) -> None:
    policy = ToolPolicy(mode="required", max_calls=2)
    deltas = await collect(smollm2, ask("Weather in Paris, Rome, Oslo and Lima?", policy=policy, max_tokens=160))

    assert 1 <= len(assert_valid_calls(deltas, cut_short=True)) <= 2


async def test_tool_choice_none_never_calls(smollm2: LocalBackend) -> None:
    begging = (
        'Call get_weather now. Reply with exactly this and nothing else: '
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    )
    deltas = await collect(smollm2, ask(begging, policy=ToolPolicy(mode="none")))

    assert not calls_of(deltas)
    assert "{" in text_of(deltas)  # it wrote JSON, which stays text
    assert isinstance(deltas[-1], Finish) and deltas[-1].reason in ("stop", "length")


async def test_a_schema_that_cannot_be_enforced_is_rejected_before_generation(smollm2: LocalBackend) -> None:
    broken = ToolSpec("broken", parameters={"type": "object", "properties": {"x": {"not": {"type": "string"}}}})
    request = ask("Hi", tools=(WEATHER, broken), policy=ToolPolicy(mode="required"))

    with pytest.raises(InvalidRequest) as raised:
        await collect(smollm2, request)
    assert raised.value.param == "tools[1].parameters"
    pool = smollm2.slot_pool(SMOLLM2)
    assert pool is not None and pool.busy == 0


POLICIES = [
    ToolPolicy(),
    ToolPolicy(mode="none"),
    ToolPolicy(mode="required"),
    ToolPolicy(mode="required", allowed=("get_time",)),
    ToolPolicy(mode="auto", allowed=("search_web",)),
    ToolPolicy(mode="required", allowed=("search_web", "get_time"), parallel=False, max_calls=1),
]


async def prompts_by_policy(backend: LocalBackend, model: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The prompt text the model sees for the same conversation under each of ``POLICIES``."""
    seen: list[str] = []
    render = Vocabulary.prompt

    def recording(self: Vocabulary, *args: object) -> str:
        seen.append(render(self, *args))  # type: ignore[arg-type]
        return seen[-1]

    monkeypatch.setattr(Vocabulary, "prompt", recording)
    for policy in POLICIES:
        await collect(backend, ask("What's the weather like in Paris?", model=model, policy=policy, max_tokens=1))
    return seen


async def test_the_prompt_is_the_same_whatever_the_policy(smollm2: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = await prompts_by_policy(smollm2, SMOLLM2, monkeypatch)

    assert len(prompts) == len(POLICIES) and len(set(prompts)) == 1
    assert all(f'"name": "{tool.name}"' in prompts[0] for tool in TOOLS)


async def test_counted_tokens_include_the_tools(smollm2: LocalBackend) -> None:
    request = ask("What's the weather like in Paris?", max_tokens=1)
    finish = (await collect(smollm2, request))[-1]

    assert isinstance(finish, Finish) and finish.usage is not None
    assert finish.usage.input_tokens == await smollm2.count_tokens(SMOLLM2, request.messages, request.tools)
    assert finish.usage.input_tokens > await smollm2.count_tokens(SMOLLM2, request.messages) + 100


@pytest.fixture
async def qwen(qwen_cache_dir: Path) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(qwen_cache_dir, n_threads=2, models=[QWEN], preload=[QWEN])
    await backend.start()
    yield backend
    await backend.aclose()


CITY_WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
QWEN_TOOLS = (CITY_WEATHER, SEARCH)


@pytest.mark.slow
async def test_qwen_calls_the_right_tool_on_its_own_and_sees_all_tools(
    qwen: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    deltas = await collect(qwen, ask("What's the weather in Paris?", model=QWEN, tools=QWEN_TOOLS, max_tokens=48))

    [call] = calls_of(deltas)
    assert call.name == "get_weather" and json.loads(call.arguments)["city"].lower().startswith("paris")
    assert isinstance(deltas[-1], Finish) and deltas[-1].reason == "tool_calls"
    assert not text_of(deltas).strip()

    prompts = await prompts_by_policy(qwen, QWEN, monkeypatch)
    assert len(set(prompts)) == 1 and "<tools>" in prompts[0]
    assert all(f'"name": "{tool.name}"' in prompts[0] for tool in TOOLS)


@pytest.mark.slow
async def test_qwen_answers_from_a_tool_result(qwen: LocalBackend) -> None:
    conversation = (
        ChatMessage("user", "What's the weather in Paris?"),
        ChatMessage("assistant", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
        ChatMessage("tool", '{"temp_c": 18, "condition": "light rain"}', tool_call_id="call_1"),
    )
    deltas = await collect(qwen, ask(*conversation, model=QWEN, tools=QWEN_TOOLS, max_tokens=40))

    assert not calls_of(deltas)
    assert "18" in text_of(deltas) and "rain" in text_of(deltas).lower()


@pytest.mark.slow
async def test_qwen_forced_call_is_written_in_its_own_tags(qwen: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = record_raw_text(monkeypatch)
    policy = ToolPolicy(mode="required", allowed=("search_web",), parallel=False)
    deltas = await collect(qwen, ask("What's the weather in Paris?", model=QWEN, tools=QWEN_TOOLS, policy=policy))

    [call] = calls_of(deltas)
    assert call.name == "search_web" and json.loads(call.arguments)["query"]
    assert isinstance(deltas[-1], Finish) and deltas[-1].reason == "tool_calls" and len(deltas) == 2
    assert raw[0] == "<tool_call>" and "".join(raw).endswith("}\n</tool_call>")


def plan_body(vocabulary: Vocabulary, request: GenerationRequest) -> dict[str, object]:
    return completion_body(make_plan(request, LOCAL_MODELS[request.model], vocabulary), [1, 2, 3], 16)


def test_qwen_auto_sends_the_call_grammar_lazily_and_none_sends_nothing(qwen_cache_dir: Path) -> None:
    vocabulary = Vocabulary(LOCAL_MODELS[QWEN], ModelFiles(qwen_cache_dir).path(QWEN))
    try:
        opening = vocabulary.call_shape.trigger
        assert opening is not None
        auto = plan_body(vocabulary, ask("hi", model=QWEN, tools=QWEN_TOOLS))
        assert auto["grammar_lazy"] is True
        assert auto["grammar_triggers"] == [{"type": 0, "value": "<tool_call>", "token": opening},
                                            {"type": 3, "value": BARE_CALL_TRIGGER}]
        forced = plan_body(vocabulary, ask("hi", model=QWEN, tools=QWEN_TOOLS, policy=ToolPolicy(mode="required")))
        assert "grammar_lazy" not in forced
        assert str(auto["grammar"]).startswith("root ::= tool-call-block")
        assert str(auto["grammar"]).split("\n")[0].endswith("| bare-calls")
        assert set(str(forced["grammar"]).split("\n")[1:]) <= set(str(auto["grammar"]).split("\n"))
        for quiet in (ask("hi", model=QWEN, tools=QWEN_TOOLS, policy=ToolPolicy(mode="none")),
                      ask("hi", model=QWEN, tools=())):
            body = plan_body(vocabulary, quiet)
            assert not {"grammar", "grammar_lazy", "grammar_triggers"} & set(body)
        # A text.format schema keeps its own grammar, applied from the first token.
        formatted = replace(ask("hi", model=QWEN, tools=QWEN_TOOLS),
                            output_format=OutputFormat(kind="json_schema", schema={"type": "object"}))
        body = plan_body(vocabulary, formatted)
        assert "grammar" in body and "grammar_lazy" not in body
        # A schema the converter refuses leaves the call free under auto, as before.
        odd = ToolSpec(name="odd", parameters={"type": "object", "properties": {"x": {"$ref": "https://x/y"}}})
        body = plan_body(vocabulary, ask("hi", model=QWEN, tools=(odd,)))
        assert not {"grammar", "grammar_lazy"} & set(body)
    finally:
        vocabulary.close()


def test_smollm2_writes_bare_calls_and_its_lazy_grammar_waits_for_one(tmp_path: Path) -> None:
    vocabulary = Vocabulary(LOCAL_MODELS[SMOLLM2], ModelFiles(tmp_path).path(SMOLLM2))
    try:
        assert vocabulary.call_shape.trigger is None
        body = plan_body(vocabulary, ask("hi"))
        assert body["grammar_lazy"] is True and str(body["grammar"]).startswith("root ::= bare-calls\n")
        assert body["grammar_triggers"] == [{"type": 3, "value": BARE_CALL_TRIGGER}]
    finally:
        vocabulary.close()


SHORT_CITY = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string", "maxLength": 3}}, "required": ["city"],
                "additionalProperties": False},
)


@pytest.mark.slow
async def test_qwen_auto_call_opened_with_its_tag_is_held_to_the_schema(
    qwen: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once Qwen opens a call with its tag token under ``auto``, the lazy grammar holds
    the call: "Paris" does not fit ``maxLength: 3``. (Qwen2.5-Coder 1.5B writes this call
    in a fenced block of its own accord; a bias on the tag token makes it open the call
    with the tag, which is what the grammar waits for.)"""
    from app.backends import local

    tag = (await qwen._residency.loaded(qwen._entry(QWEN))).vocabulary.call_shape.trigger
    body = local.completion_body
    monkeypatch.setattr(local, "completion_body", lambda *args: {**body(*args), "logit_bias": [[tag, 30.0]]})
    raw = record_raw_text(monkeypatch)
    policy = ToolPolicy(parallel=False)
    deltas = await collect(qwen, ask("What's the weather in Paris?", model=QWEN, tools=(SHORT_CITY, SEARCH),
                                     policy=policy, max_tokens=48))

    [call] = calls_of(deltas)
    assert call.name == "get_weather", raw
    jsonschema.validate(json.loads(call.arguments), SHORT_CITY.parameters)
    assert raw[0] == "<tool_call>" and "".join(raw).endswith("}\n</tool_call>")
    assert isinstance(deltas[-1], Finish) and deltas[-1].reason == "tool_calls"


@pytest.mark.slow
async def test_qwen_auto_call_written_in_a_fenced_block_is_held_to_the_schema(
    qwen: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2.5-Coder 1.5B writes this call in a fenced JSON block of its own accord
    (without the bias of the test above); the lazy grammar takes it from its brace:
    "Paris" does not fit ``maxLength: 3``, the name is one of the tools."""
    raw = record_raw_text(monkeypatch)
    policy = ToolPolicy(parallel=False)
    deltas = await collect(qwen, ask("What's the weather in Paris?", model=QWEN, tools=(SHORT_CITY, SEARCH),
                                     policy=policy, max_tokens=64))

    written = "".join(raw)
    assert written.lstrip().startswith(("```", "{")), written
    [call] = calls_of(deltas)
    assert call.name in ("get_weather", "search_web"), written
    arguments = json.loads(call.arguments)
    if call.name == "get_weather":
        jsonschema.validate(arguments, SHORT_CITY.parameters)
    assert isinstance(deltas[-1], Finish) and deltas[-1].reason == "tool_calls"


def test_a_server_wide_temperature_is_the_default_a_request_overrides(tmp_path: Path) -> None:
    """``ORS_MODEL_TEMPERATURE`` (here 0) replaces the model's own default, for a request
    that sets none; a request's own temperature still wins."""
    spec = LocalBackend(tmp_path, models=[SMOLLM2], temperature=0.0)._entry(SMOLLM2).spec
    assert LocalBackend(tmp_path, models=[SMOLLM2])._entry(SMOLLM2).spec.sampling.temperature == 0.2
    vocabulary = Vocabulary(spec, ModelFiles(tmp_path).path(SMOLLM2))
    try:
        unset = completion_body(make_plan(ask("hi", temperature=None), spec, vocabulary), [1], 8)
        chosen = completion_body(make_plan(ask("hi", temperature=0.9), spec, vocabulary), [1], 8)
    finally:
        vocabulary.close()
    assert unset["temperature"] == 0.0 and chosen["temperature"] == 0.9
