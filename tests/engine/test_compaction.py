"""Compaction logic, against the deterministic ``ScriptedBackend`` (a test backend whose
answers are scripted, so the summarising calls can be inspected exactly)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from app.backends.base import ChatMessage, Finish, GenerationRequest, TextDelta, ToolSpec, Usage
from app.backends.scripted import ScriptedBackend, text_script
from app.engine.compaction import (
    SUMMARY_HEADER,
    Entry,
    compact,
    compact_request,
    compaction_context,
    input_entries,
    summary_of,
)
from app.engine.history import History, HistorySource, NoHistory
from app.engine.models import ModelRouter
from app.engine.sealing import Sealer, SealError
from app.engine.validation import parse_body
from app.errors import InvalidRequest, ModelNotFound, PreviousResponseNotFound
from app.protocol.compaction import CompactBody
from app.protocol.items import (
    AssistantMessageParam,
    CompactionParam,
    FunctionCallOutputParam,
    FunctionCallParam,
    SystemMessageParam,
    UserMessageParam,
)
from compliance import check_compact

MODEL = "scripted-summariser"
SUMMARY = "Alice launches on Tuesday; support is told first."

pytestmark = pytest.mark.anyio


@pytest.fixture()
def sealer() -> Sealer:
    return Sealer.from_settings(Fernet.generate_key().decode(), Path("unused"))


def scripted(*pieces: str, usage: Usage | None = Usage(40, 5)) -> ScriptedBackend:
    """The scripted test backend, answering every summarising call with ``pieces``."""
    return ScriptedBackend({MODEL: [*(TextDelta(p) for p in pieces), Finish("stop", usage)]})


def user(text: str, **extra: Any) -> UserMessageParam:
    return UserMessageParam(role="user", content=text, **extra)


def assistant(text: str, **extra: Any) -> AssistantMessageParam:
    return AssistantMessageParam(role="assistant", content=text, **extra)


def entries(*items: object) -> list[Entry]:
    return [Entry(item, f"input[{index}]") for index, item in enumerate(items)]


THREE_TURNS = (
    user("My name is Alice."),
    assistant("Hello Alice."),
    user("We launch on Tuesday and notify support first."),
    assistant("Noted: Tuesday, support first."),
    user("What day do we launch?"),
    assistant("Tuesday."),
)


def texts(item: dict[str, Any]) -> list[str]:
    return [part["text"] for part in item["content"]]


async def test_older_turns_become_one_sealed_summary_before_the_last_turn(sealer: Sealer) -> None:
    backend = scripted(SUMMARY)
    resource = await compact(backend=backend, model=MODEL, sealer=sealer, entries=entries(*THREE_TURNS))
    wire = check_compact(resource.model_dump(mode="json"))

    assert wire["object"] == "response.compaction"
    assert [item["type"] for item in wire["output"]] == ["compaction", "message", "message"]
    compaction, last_user, last_answer = wire["output"]
    assert compaction["id"].startswith("cmp_") and compaction["status"] == "completed"
    assert SUMMARY not in compaction["encrypted_content"]
    assert summary_of(sealer, compaction["encrypted_content"]) == SUMMARY
    assert sealer.unseal("compaction", compaction["encrypted_content"])["model"] == MODEL
    assert (last_user["role"], texts(last_user)) == ("user", ["What day do we launch?"])
    assert (last_answer["role"], texts(last_answer)) == ("assistant", ["Tuesday."])
    assert all(item["id"] and item["status"] == "completed" for item in wire["output"])
    assert not wire["id"].startswith("resp_")

    [request] = backend.requests
    assert request.sampling.max_output_tokens == 256
    asked = request.messages[-1].content
    assert "User: My name is Alice." in asked and "Assistant: Noted: Tuesday, support first." in asked
    assert "What day do we launch?" not in asked
    assert wire["usage"] == {"input_tokens": 40, "output_tokens": 5, "total_tokens": 45,
                             "input_tokens_details": {"cached_tokens": 0},
                             "output_tokens_details": {"reasoning_tokens": 0}}


async def test_a_single_turn_needs_no_model_call_but_still_gets_a_compaction_item(sealer: Sealer) -> None:
    backend = scripted(SUMMARY)
    resource = await compact(backend=backend, model=MODEL, sealer=sealer,
                             entries=entries(user("Hi", id="msg_mine"), assistant("Hello!")))
    wire = check_compact(resource.model_dump(mode="json"))
    assert backend.requests == []
    assert [item["type"] for item in wire["output"]] == ["compaction", "message", "message"]
    assert wire["output"][1]["id"] == "msg_mine"
    assert summary_of(sealer, wire["output"][0]["encrypted_content"]) == ""
    assert compaction_context(sealer, wire["output"][0]["encrypted_content"]) == ""
    assert wire["usage"]["total_tokens"] == 0


class CountingBackend(ScriptedBackend):
    """The scripted test backend with a small context window, counting one token per word."""

    def __init__(self, window: int, answer: Any) -> None:
        super().__init__({MODEL: answer})
        self.window = window

    def context_window(self, model: str) -> int | None:
        return self.window

    async def count_tokens(self, model: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()) -> int:
        return sum(len(message.content.split()) + 1 for message in messages)


async def test_kept_items_are_counted_as_input_when_the_backend_can_count(sealer: Sealer) -> None:
    backend = CountingBackend(10_000, [TextDelta("s"), Finish("stop", Usage(40, 5))])
    resource = await compact(backend=backend, model=MODEL, sealer=sealer, entries=entries(*THREE_TURNS))
    kept = len("What day do we launch?".split()) + 1 + len("Tuesday.".split()) + 1
    assert resource.usage.input_tokens == 40 + kept
    assert resource.usage.total_tokens == 45 + kept


async def test_a_long_transcript_is_summarised_in_chunks_that_fit_the_window(sealer: Sealer) -> None:
    calls: list[GenerationRequest] = []

    def answer(request: GenerationRequest) -> list[Any]:
        calls.append(request)
        return text_script(f"summary-{len(calls)}")

    backend = CountingBackend(700, answer)
    older = [user(f"turn {n} " + "word " * 60) for n in range(12)]
    resource = await compact(backend=backend, model=MODEL, sealer=sealer,
                             entries=entries(*older, user("last question")))
    assert len(calls) > 1
    for request in calls:
        counted = await backend.count_tokens(MODEL, request.messages)
        assert counted + 256 <= 700
    assert "Summary so far:\nsummary-1" in calls[1].messages[-1].content
    joined = "".join(request.messages[-1].content for request in calls)
    assert all(f"turn {n} " in joined for n in range(12))
    assert summary_of(sealer, resource.output[0]["encrypted_content"]) == f"summary-{len(calls)}"


async def test_an_oversized_message_is_cut_to_fit(sealer: Sealer) -> None:
    backend = CountingBackend(700, text_script("short"))
    await compact(backend=backend, model=MODEL, sealer=sealer,
                  entries=entries(user("huge " * 5000), user("last question")))
    [request] = backend.requests
    assert await backend.count_tokens(MODEL, request.messages) + 256 <= 700
    assert "[...]" in request.messages[-1].content


async def test_system_messages_are_kept_verbatim_ahead_of_the_summary(sealer: Sealer) -> None:
    backend = scripted(SUMMARY)
    items = (SystemMessageParam(role="system", content="Answer in French."), *THREE_TURNS)
    resource = await compact(backend=backend, model=MODEL, sealer=sealer, entries=entries(*items),
                             instructions="Be brief.")
    output = resource.output
    assert [(item["type"], item.get("role")) for item in output] == [
        ("message", "system"), ("compaction", None), ("message", "user"), ("message", "assistant")]
    assert texts(output[0]) == ["Answer in French."]
    system_prompt, asked = (message.content for message in backend.requests[0].messages)
    assert "Answer in French." not in asked
    assert system_prompt.endswith("Be brief.")


async def test_tool_calls_and_outputs_are_summarised_as_text(sealer: Sealer) -> None:
    backend = scripted(SUMMARY)
    items = (
        user("Weather in Paris?"),
        FunctionCallParam(type="function_call", call_id="call_1", name="get_weather", arguments='{"city":"Paris"}'),
        FunctionCallOutputParam(type="function_call_output", call_id="call_1", output="18C and sunny"),
        assistant("It is 18C and sunny."),
        user("Thanks!"),
    )
    await compact(backend=backend, model=MODEL, sealer=sealer, entries=entries(*items))
    asked = backend.requests[0].messages[-1].content
    assert 'Assistant called get_weather({"city":"Paris"}) (call call_1)' in asked
    assert "Tool result (call call_1): 18C and sunny" in asked


async def test_kept_tool_items_get_ids_and_statuses(sealer: Sealer) -> None:
    items = (
        user("Weather in Paris?"),
        FunctionCallParam(type="function_call", call_id="call_1", name="get_weather", arguments="{}"),
        FunctionCallOutputParam(type="function_call_output", call_id="call_1", output="sunny"),
    )
    resource = await compact(backend=scripted(), model=MODEL, sealer=sealer, entries=entries(*items))
    wire = check_compact(resource.model_dump(mode="json"))
    assert [item["type"] for item in wire["output"]] == ["compaction", "message", "function_call",
                                                         "function_call_output"]
    assert all(item["id"] and item["status"] == "completed" for item in wire["output"])


async def test_an_earlier_compaction_is_folded_into_the_new_summary(sealer: Sealer) -> None:
    first = await compact(backend=scripted("Alice likes tea."), model=MODEL, sealer=sealer,
                          entries=entries(*THREE_TURNS))
    window = [CompactionParam(**item) if item["type"] == "compaction" else
              (user if item["role"] == "user" else assistant)(item["content"][0]["text"])
              for item in first.output]
    backend = scripted("Alice likes tea and launches Tuesday.")
    second = await compact(backend=backend, model=MODEL, sealer=sealer,
                           entries=entries(*window, user("And coffee?")))
    asked = backend.requests[0].messages[-1].content
    assert f"{SUMMARY_HEADER}\nAlice likes tea." in asked
    assert [item["type"] for item in second.output] == ["compaction", "message"]
    assert summary_of(sealer, second.output[0]["encrypted_content"]) == "Alice likes tea and launches Tuesday."


async def test_a_tampered_compaction_item_is_refused_with_its_param(sealer: Sealer) -> None:
    token = sealer.seal("compaction", {"summary": "x", "model": MODEL, "created_at": 0})
    tampered = token[:-6] + ("AAAAAA" if token[-6:] != "AAAAAA" else "BBBBBB")
    for items, param in [
        ((CompactionParam(type="compaction", encrypted_content=tampered), user("q")), "input[0]"),
        ((user("q"), CompactionParam(type="compaction", encrypted_content=tampered)), "input[1]"),
        ((CompactionParam(type="compaction", encrypted_content="plain text"), user("q")), "input[0]"),
    ]:
        with pytest.raises(SealError) as caught:
            await compact(backend=scripted(SUMMARY), model=MODEL, sealer=sealer, entries=entries(*items))
        assert (caught.value.code, caught.value.param) == ("invalid_encrypted_content", param)


async def test_a_reasoning_blob_is_not_a_compaction_blob(sealer: Sealer) -> None:
    token = sealer.seal("reasoning", {"summary": "x"})
    with pytest.raises(SealError):
        compaction_context(sealer, token)
    good = sealer.seal("compaction", {"summary": "Earlier: Alice.", "model": MODEL, "created_at": 0})
    assert compaction_context(sealer, good) == f"{SUMMARY_HEADER}\nEarlier: Alice."


async def test_an_empty_summary_keeps_the_transcript(sealer: Sealer) -> None:
    backend = scripted("   ")
    resource = await compact(backend=backend, model=MODEL, sealer=sealer, entries=entries(*THREE_TURNS))
    summary = summary_of(sealer, resource.output[0]["encrypted_content"])
    assert "User: My name is Alice." in summary


async def test_repeated_ids_are_made_unique(sealer: Sealer) -> None:
    items = (user("a", id="msg_1"), assistant("b", id="msg_1"), SystemMessageParam(role="system", content="s"))
    resource = await compact(backend=scripted(), model=MODEL, sealer=sealer, entries=entries(*items))
    check_compact(resource.model_dump(mode="json"))


async def test_references_foreign_items_and_triggers_cannot_be_compacted(sealer: Sealer) -> None:
    body = parse_body(CompactBody, {"model": MODEL, "input": [
        {"role": "user", "content": "q"}, {"type": "item_reference", "id": "msg_1"}]})
    with pytest.raises(InvalidRequest) as caught:
        await compact(backend=scripted(), model=MODEL, sealer=sealer, entries=input_entries(body.input))
    assert (caught.value.code, caught.value.param) == ("unsupported_item", "input[1]")
    body = parse_body(CompactBody, {"model": MODEL, "input": [{"type": "acme:thing", "x": 1}]})
    with pytest.raises(InvalidRequest) as caught:
        await compact(backend=scripted(), model=MODEL, sealer=sealer, entries=input_entries(body.input))
    assert caught.value.param == "input[0]"
    body = parse_body(CompactBody, {"model": MODEL, "input": [
        {"role": "user", "content": "q"}, {"type": "compaction_trigger"}]})
    with pytest.raises(InvalidRequest) as caught:
        await compact(backend=scripted(), model=MODEL, sealer=sealer, entries=input_entries(body.input))
    assert (caught.value.code, caught.value.param) == ("unsupported_item", "input[1]")


class FixedHistory(HistorySource):
    def __init__(self, items: list[object]) -> None:
        self.items = items
        self.loaded: list[str] = []

    async def load(self, response_id: str) -> History:
        self.loaded.append(response_id)
        return History(items=list(self.items))


async def test_request_puts_the_chain_before_the_input(sealer: Sealer) -> None:
    backend = scripted(SUMMARY)
    router = ModelRouter([backend], MODEL)
    history = FixedHistory(list(THREE_TURNS))
    body = parse_body(CompactBody, {"model": MODEL, "previous_response_id": "resp_1", "input": "One more thing."})
    resource = await compact_request(body, router=router, history=history, sealer=sealer)
    assert history.loaded == ["resp_1"]
    assert [texts(item) for item in resource.output[1:]] == [["One more thing."]]
    assert "User: What day do we launch?" in backend.requests[0].messages[-1].content


async def test_request_errors(sealer: Sealer) -> None:
    router = ModelRouter([scripted()], MODEL)
    with pytest.raises(ModelNotFound) as missing:
        await compact_request(parse_body(CompactBody, {"model": "nope", "input": "x"}), router=router,
                              history=NoHistory(), sealer=sealer)
    assert missing.value.param == "model"
    with pytest.raises(PreviousResponseNotFound) as unknown:
        await compact_request(parse_body(CompactBody, {"model": MODEL, "previous_response_id": "resp_x"}),
                              router=router, history=NoHistory(), sealer=sealer)
    assert unknown.value.param == "previous_response_id"


@pytest.mark.parametrize(
    ("data", "param", "code"),
    [
        ({"input": "x"}, "model", "missing_required_parameter"),
        ({"model": None, "input": "x"}, "model", "invalid_value"),
        ({"model": 3, "input": "x"}, "model", "invalid_value"),
        ({"model": "m", "prompt_cache_key": "k" * 65}, "prompt_cache_key", "string_above_max_length"),
        ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role", "invalid_value"),
    ],
)
async def test_body_errors_name_their_param(data: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_body(CompactBody, data)
    assert (caught.value.param, caught.value.code) == (param, code)


async def test_body_ignores_unknown_top_level_fields() -> None:
    body = parse_body(CompactBody, {"model": "m", "input": "x", "prompt_cache_key": "k", "stream": True})
    assert body.model == "m" and body.input == "x"
