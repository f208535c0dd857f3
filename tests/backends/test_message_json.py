"""``MessageJson``: each past message's JSON made once, a long conversation's past joined
once; every body is exactly what serializing all its messages afresh gives."""

from __future__ import annotations

import json

import pytest

from app.backends import message_json
from app.backends.base import ChatMessage
from app.backends.message_json import RUN_MIN, MessageJson, dumps


def _convert(message: ChatMessage) -> str:
    return dumps({"role": message.role, "content": message.content})


def _fresh(messages: tuple[ChatMessage, ...]) -> bytes:
    return MessageJson(_convert).body({"model": "m"}, "messages", messages)


def _conversation(turns: int) -> tuple[ChatMessage, ...]:
    messages: tuple[ChatMessage, ...] = ()
    for turn in range(turns):
        messages += (ChatMessage("user", f"question {turn}"), ChatMessage("assistant", f"answer {turn}"))
    return messages


class _Walked(MessageJson):
    """Counts the messages looked up one by one."""

    walked = 0

    def _fragments(self, messages):  # type: ignore[no-untyped-def]
        self.walked += len(messages)
        return super()._fragments(messages)


@pytest.mark.parametrize("instructions", [False, True])
def test_a_continued_conversation_looks_up_only_its_new_messages(instructions: bool) -> None:
    adapter = _Walked(_convert)
    past = _conversation(RUN_MIN)  # 128 messages
    system = (ChatMessage("system", "be brief"),) if instructions else ()
    first = system + past
    assert adapter.body({"model": "m"}, "messages", first) == _fresh(first)
    new = (ChatMessage("user", "one more"),)
    system = (ChatMessage("system", "be brief"),) if instructions else ()  # a new object each turn
    second = system + past + new
    adapter.walked = 0
    body = adapter.body({"model": "m"}, "messages", second)
    assert body == _fresh(second)
    assert adapter.walked == len(system) + len(new)
    assert [m["content"] for m in json.loads(body)["messages"]][-1] == "one more"


def test_a_conversation_continued_from_an_earlier_turn_reads_the_same_as_afresh() -> None:
    adapter = MessageJson(_convert)
    past = _conversation(RUN_MIN)
    latest = past + (ChatMessage("user", "latest"),)
    adapter.body({"model": "m"}, "messages", latest)
    branch = past[:RUN_MIN] + (ChatMessage("user", "a branch"),)  # from an earlier turn
    assert adapter.body({"model": "m"}, "messages", branch) == _fresh(branch)
    again = latest + (ChatMessage("assistant", "and on"),)
    assert adapter.body({"model": "m"}, "messages", again) == _fresh(again)


def test_equal_messages_that_are_other_objects_give_the_same_body() -> None:
    adapter = MessageJson(_convert)
    past = _conversation(RUN_MIN)
    adapter.body({"model": "m"}, "messages", past)
    rebuilt = tuple(ChatMessage(m.role, m.content) for m in past) + (ChatMessage("user", "next"),)
    assert adapter.body({"model": "m"}, "messages", rebuilt) == _fresh(rebuilt)


def test_past_text_beyond_the_budget_is_dropped_and_bodies_stay_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(message_json, "RUNS_CHARS", 5_000)
    adapter = MessageJson(_convert)
    conversations = [tuple(ChatMessage("user", f"c{c} m{i}") for i in range(RUN_MIN)) for c in range(20)]
    for conversation in conversations:
        adapter.body({"model": "m"}, "messages", conversation)
    assert adapter._runs_chars <= 5_000 or len(adapter._runs) == 1
    for conversation in conversations:
        longer = conversation + (ChatMessage("user", "next"),)
        assert adapter.body({"model": "m"}, "messages", longer) == _fresh(longer)


def test_messages_that_make_no_fragment_leave_none() -> None:
    adapter = MessageJson(lambda message: "" if message.role == "tool" else _convert(message))
    past = tuple(ChatMessage("tool" if i % 3 == 0 else "user", f"m{i}") for i in range(RUN_MIN * 2))
    reference = MessageJson(lambda message: "" if message.role == "tool" else _convert(message))
    adapter.body({"model": "m"}, "messages", past)
    longer = past + (ChatMessage("tool", "x"), ChatMessage("user", "y"))
    assert adapter.body({"model": "m"}, "messages", longer) == reference.body({"model": "m"}, "messages", longer)
    json.loads(adapter.body({"model": "m"}, "messages", longer))
