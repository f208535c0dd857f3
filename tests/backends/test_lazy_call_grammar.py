"""The lazy call grammar under ``auto`` and the trigger that starts it, without a model:
whatever text the trigger matches, the grammar takes from the brace on (llama-server
replays it into the grammar, and a piece the grammar refuses would fail the generation),
and it holds the call that follows to the tools."""

from __future__ import annotations

import json
import re

import pytest

from app.backends.base import ToolPolicy, ToolSpec
from app.backends.call_syntax import call_shape
from app.backends.grammar import BARE_CALL_TRIGGER, lazy_call_grammar
from tests.backends.gbnf import Grammar

CITY = ToolSpec(name="get_weather", parameters={
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 3}}, "required": ["city"],
    "additionalProperties": False})
SEARCH = ToolSpec(name="search_web", parameters={
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]})
TRIGGER = re.compile(BARE_CALL_TRIGGER)


def grammar(policy: ToolPolicy | None = None) -> Grammar:
    text = lazy_call_grammar((CITY, SEARCH), policy or ToolPolicy(), call_shape(False))
    assert text is not None and text.startswith("root ::= bare-calls\n")
    return Grammar(text)


OPENINGS = ['{"name":', '{"name": "', "```json\n{\n  \"name\":", "```\n{ \"name\" : \"", "  ```tool_call\n{\"name\":",
            '\n\n{\n\t"name"\n:\n"']


@pytest.mark.parametrize("opening", OPENINGS)
def test_what_the_trigger_matches_the_grammar_takes_from_the_brace(opening: str) -> None:
    match = TRIGGER.match(opening)
    assert match is not None
    start = match.start(1)
    assert opening[start] == "{"
    rest = ' "get_weather", "arguments": {"city": "Par"}}' if not opening.endswith('"') else 'get_weather", ' \
        '"arguments": {"city": "Par"}}'
    fence = "\n```" if "```" in opening else ""
    assert grammar().matches(opening[start:] + rest + fence), opening


@pytest.mark.parametrize("text", ['Sure: {"name":', '{"name": "get', '```python\n{"name":', '{"arguments": {}, "name":',
                                  '{{"name":', 'The weather'])
def test_the_trigger_waits_for_a_call_at_the_start_of_the_answer(text: str) -> None:
    assert TRIGGER.match(text) is None


def test_the_grammar_holds_the_call_to_the_tools() -> None:
    held = grammar()
    assert held.matches('{"name": "get_weather", "arguments": {"city": "Par"}}')
    assert held.matches('{\n  "name": "search_web",\n  "arguments": {"query": "rain"}\n}\n```')
    assert not held.matches('{"name": "get_weather", "arguments": {"city": "Paris"}}'), "maxLength"
    assert not held.matches('{"name": "shell", "arguments": {"cmd": "ls"}}'), "not a tool"
    assert not held.matches('{"name": "get_weather", "arguments": {"city": "Par"}, "extra": 1}')
    two = '{"name": "get_weather", "arguments": {"city": "Par"}}\n```\n```json\n{"name": "search_web", ' \
          '"arguments": {"query": "rain"}}\n```'
    assert held.matches(two)
    assert not grammar(ToolPolicy(parallel=False)).matches(two), "one call when parallel calls are off"
    assert not grammar(ToolPolicy(allowed=("search_web",))).matches(
        '{"name": "get_weather", "arguments": {"city": "Par"}}'), "allowed_tools"


def test_no_grammar_but_under_auto() -> None:
    for mode in ("none", "required"):
        assert lazy_call_grammar((CITY,), ToolPolicy(mode=mode), call_shape(False)) is None  # type: ignore[arg-type]
    assert json.dumps(BARE_CALL_TRIGGER)  # sent as JSON to llama-server
