"""The embedded backend's tool-call parser, forcing grammar and tool prompt, without a model."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence

import pytest

from app.backends.base import (
    ChatMessage,
    Delta,
    GenerationRequest,
    OutputFormat,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolPolicy,
    ToolSpec,
)
from app.backends.grammar import lazy_call_grammar
from app.backends.prompting import (
    DEFAULT_SYSTEM,
    JSON_CHAR_RULE,
    TOOL_RESULT_HINT,
    ChatTemplate,
    output_grammar,
    prompt_messages,
    template_tools,
)
from app.backends.toolcalls import (
    MAX_FORCED_CALLS,
    CallShape,
    ToolCallParser,
    call_shape,
    tool_call_grammar,
    tool_call_parser,
)
from app.errors import InvalidRequest

TOOLS = ("get_weather", "search_web", "get_time")
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
SEARCH = '{"name": "search_web", "arguments": {"query": "James Webb news"}}'
TIME = '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}'


def tagged(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def fenced(body: str, label: str = "json") -> str:
    return f"```{label}\n{body}\n```"


def parse(chunks: Sequence[str], policy: ToolPolicy | None = None, tools: Sequence[str] = TOOLS) -> list[Delta]:
    parser = ToolCallParser(tools, policy or ToolPolicy())
    deltas: list[Delta] = []
    for chunk in chunks:
        deltas.extend(parser.feed(chunk))
    deltas.extend(parser.close())
    return deltas


def outcome(deltas: Sequence[Delta]) -> list[tuple[str, ...]]:
    """Text runs merged, calls as (name, arguments): what a client would end up with."""
    result: list[tuple[str, ...]] = []
    for delta in deltas:
        if isinstance(delta, TextDelta):
            if result and result[-1][0] == "text":
                result[-1] = ("text", result[-1][1] + delta.text)
            else:
                result.append(("text", delta.text))
        elif isinstance(delta, ToolCallDelta):
            assert delta.name is not None
            result.append(("call", delta.name, delta.arguments))
    return result


def whole(text: str, policy: ToolPolicy | None = None) -> list[tuple[str, ...]]:
    return outcome(parse([text], policy))


def call(name: str, **arguments: object) -> tuple[str, ...]:
    return ("call", name, json.dumps(arguments, separators=(",", ":")))


# What the model writes, and what the client must get from it.
CASES: list[tuple[str, list[tuple[str, ...]]]] = [
    ("The capital of France is Paris.", [("text", "The capital of France is Paris.")]),
    ("  Leading space, trailing newline\n", [("text", "  Leading space, trailing newline\n")]),
    ("Use <b>bold</b> and a < b, then <tool and <tool_cal.", [("text", "Use <b>bold</b> and a < b, then <tool and <tool_cal.")]),
    (tagged(WEATHER), [call("get_weather", city="Paris")]),
    (fenced(WEATHER), [call("get_weather", city="Paris")]),
    (fenced(WEATHER, label=""), [call("get_weather", city="Paris")]),
    (WEATHER, [call("get_weather", city="Paris")]),
    ("\n" + WEATHER + "\n", [call("get_weather", city="Paris")]),
    ('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```', [call("get_weather", city="Paris")]),
    ('{{"name": "search_web", "arguments": {"query": "x"}}}', [call("search_web", query="x")]),
    ('{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}', [call("get_time", tz="UTC")]),
    ('<tool_call>{"name": "get_time"}</tool_call>', [call("get_time")]),
    ('{"name": "search_web", "arguments": {"query": "two\nlines"}}', [call("search_web", query="two\nlines")]),
    ("Let me check the weather.\n" + tagged(WEATHER), [("text", "Let me check the weather."), call("get_weather", city="Paris")]),
    (tagged(WEATHER) + "\n\nI asked for the weather.", [call("get_weather", city="Paris"), ("text", "I asked for the weather.")]),
    (tagged(WEATHER) + "\n" + tagged(SEARCH), [call("get_weather", city="Paris"), call("search_web", query="James Webb news")]),
    (WEATHER + "\n" + TIME, [call("get_weather", city="Paris"), call("get_time", tz="Europe/Paris")]),
    (fenced(WEATHER) + "\n" + fenced(TIME), [call("get_weather", city="Paris"), call("get_time", tz="Europe/Paris")]),
    ("<tool_call>\n" + WEATHER, [call("get_weather", city="Paris")]),
    (fenced(WEATHER)[:-3], [call("get_weather", city="Paris")]),
    # Not calls: the text stays exactly as written.
    (tagged('{"name": "add", "arguments": {"a": 2, "b": 2}}'), [("text", tagged('{"name": "add", "arguments": {"a": 2, "b": 2}}'))]),
    (fenced('{"name": "add", "arguments": {}}'), [("text", fenced('{"name": "add", "arguments": {}}'))]),
    ('{"name": "Alice", "age": 30}', [("text", '{"name": "Alice", "age": 30}')]),
    ('{"name": "get_weather", "arguments": ["Paris"]}', [("text", '{"name": "get_weather", "arguments": ["Paris"]}')]),
    ('{"name": "get_weather", "arguments": {}, "id": 1}', [("text", '{"name": "get_weather", "arguments": {}, "id": 1}')]),
    ('{"name": "get_weather", "arguments": {"city": "Paris"', [("text", '{"name": "get_weather", "arguments": {"city": "Paris"')]),
    ("{not json} at all", [("text", "{not json} at all")]),
    ("{}", [("text", "{}")]),
    ("```python\nprint('hi')\n```", [("text", "```python\nprint('hi')\n```")]),
    ("Here is the call: " + fenced(WEATHER), [("text", "Here is the call: " + fenced(WEATHER))]),
    ("Text first, then " + WEATHER, [("text", "Text first, then " + WEATHER)]),
    (tagged("get_weather Paris"), [("text", tagged("get_weather Paris"))]),
    (tagged(WEATHER + " trailing"), [("text", tagged(WEATHER + " trailing"))]),
    ("<tool_call>", [("text", "<tool_call>")]),
    ("`", [("text", "`")]),
    ("A brace { and a string \"{\" stay.", [("text", "A brace { and a string \"{\" stay.")]),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_written_calls_are_parsed_and_everything_else_stays_text(text: str, expected: list[tuple[str, ...]]) -> None:
    assert whole(text) == expected


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_the_outcome_does_not_depend_on_how_the_text_is_split(text: str, expected: list[tuple[str, ...]]) -> None:
    assert outcome(parse(list(text))) == expected
    for cut in range(1, len(text)):
        assert outcome(parse([text[:cut], text[cut:]])) == expected, cut
    step = max(1, len(text) // 12)
    for first in range(1, len(text), step):
        for second in range(first + 1, len(text), step):
            assert outcome(parse([text[:first], text[first:second], text[second:]])) == expected, (first, second)


def test_calls_are_numbered_and_carry_name_and_compact_arguments() -> None:
    deltas = parse([tagged(WEATHER) + "\n" + tagged('{"name": "get_time", "arguments": {"tz": "Europe/Zürich"}}')])

    assert deltas == [
        ToolCallDelta(index=0, name="get_weather", arguments='{"city":"Paris"}'),
        ToolCallDelta(index=1, name="get_time", arguments='{"tz":"Europe/Zürich"}'),
    ]


def test_prose_streams_without_delay() -> None:
    parser = ToolCallParser(TOOLS, ToolPolicy())

    assert parser.feed("The") == [TextDelta("The")]
    assert parser.feed(" weather is") == [TextDelta(" weather is")]
    assert parser.feed(" fine, {really}. ") == [TextDelta(" fine, {really}.")]
    assert parser.feed("Bye") == [TextDelta(" Bye")]
    assert parser.close() == []


def test_only_a_possible_tag_is_held_back_after_prose() -> None:
    parser = ToolCallParser(TOOLS, ToolPolicy())

    assert parser.feed("Checking now. <tool") == [TextDelta("Checking now.")]
    assert parser.feed("_ca") == []
    assert parser.feed("ll>\n" + WEATHER[:20]) == []
    assert parser.feed(WEATHER[20:] + "\n</tool_call>") == [ToolCallDelta(index=0, name="get_weather", arguments='{"city":"Paris"}')]


def test_a_tag_that_goes_another_way_is_released_at_once() -> None:
    parser = ToolCallParser(TOOLS, ToolPolicy())

    assert parser.feed("a <tool") == [TextDelta("a")]
    assert parser.feed("s>") == [TextDelta(" <tools>")]


@pytest.mark.parametrize(
    ("start", "held"),
    [("{", True), ('{"na', True), ("{ x", False), ("```", True), ("```js", True), ("```py", False), ("``x", False), ("Sure", False)],
)
def test_the_start_of_an_answer_is_held_only_while_it_may_be_a_call(start: str, held: bool) -> None:
    parser = ToolCallParser(TOOLS, ToolPolicy())

    assert (parser.feed(start) == []) is held


def test_a_call_to_a_tool_outside_allowed_tools_is_dropped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    policy = ToolPolicy(mode="auto", allowed=("search_web",))

    with caplog.at_level(logging.WARNING, logger="ors.tools"):
        assert whole(tagged(WEATHER), policy) == []
        assert whole(fenced(WEATHER), policy) == []
        assert whole("Let me look.\n" + tagged(WEATHER) + "\nDone.", policy) == [("text", "Let me look.\nDone.")]
        assert whole(tagged(WEATHER) + "\n" + tagged(SEARCH), policy) == [call("search_web", query="James Webb news")]
    assert "get_weather" in caplog.text and "tool_choice" in caplog.text


def test_tool_choice_none_turns_every_call_into_text() -> None:
    for text in (tagged(WEATHER), fenced(WEATHER), WEATHER):
        assert whole(text, ToolPolicy(mode="none")) == [("text", text)]


def test_without_tools_everything_is_text() -> None:
    assert outcome(parse([tagged(WEATHER)], tools=())) == [("text", tagged(WEATHER))]


def test_parallel_false_keeps_the_first_call_only(caplog: pytest.LogCaptureFixture) -> None:
    text = tagged(WEATHER) + "\n" + tagged(SEARCH) + "\n" + tagged(TIME)

    with caplog.at_level(logging.WARNING, logger="ors.tools"):
        assert whole(text, ToolPolicy(parallel=False)) == [call("get_weather", city="Paris")]
    assert caplog.text.count("parallel_tool_calls") == 2


def test_max_tool_calls_caps_the_calls(caplog: pytest.LogCaptureFixture) -> None:
    text = WEATHER + "\n" + SEARCH + "\n" + TIME

    with caplog.at_level(logging.WARNING, logger="ors.tools"):
        calls = whole(text, ToolPolicy(max_calls=2))
    assert calls == [call("get_weather", city="Paris"), call("search_web", query="James Webb news")]
    assert "max_tool_calls (2)" in caplog.text


def test_with_a_call_required_a_call_cut_short_is_not_shown(caplog: pytest.LogCaptureFixture) -> None:
    policy = ToolPolicy(mode="required")
    cut = tagged(WEATHER) + "\n" + tagged(SEARCH)[:30]

    with caplog.at_level(logging.WARNING, logger="ors.tools"):
        assert whole(cut, policy) == [call("get_weather", city="Paris")]
    assert "unfinished call" in caplog.text


def test_with_a_call_required_a_call_cut_after_its_name_is_that_call_as_far_as_written() -> None:
    policy = ToolPolicy(mode="required")
    cut = tagged(SEARCH)[: tagged(SEARCH).index("James") + 2]
    assert whole(cut, policy) == [("call", "search_web", '{"query": "Ja')]
    assert whole(SEARCH[:25], policy) == [("call", "search_web", "")]
    assert whole(tagged(WEATHER) + "\n" + cut, policy) == [
        call("get_weather", city="Paris"),
        ("call", "search_web", '{"query": "Ja'),
    ]


def test_a_cut_call_is_not_made_up_when_it_is_not_forced_or_not_allowed() -> None:
    cut = tagged(SEARCH)[: tagged(SEARCH).index("James") + 2]
    assert whole(cut) == [("text", cut)]
    only_weather = ToolPolicy(mode="required", allowed=("get_weather",))
    assert whole(cut, only_weather) == []


def test_structured_output_turns_the_parser_off_unless_a_call_is_required() -> None:
    def request(mode: str) -> GenerationRequest:
        return GenerationRequest(
            model="m",
            messages=(ChatMessage("user", "x"),),
            tools=(ToolSpec("get_weather"),),
            tool_policy=ToolPolicy(mode=mode),  # type: ignore[arg-type]
            output_format=OutputFormat(kind="json_object"),
        )

    assert tool_call_parser(request("auto")).feed(WEATHER) == [TextDelta(WEATHER)]
    parser = tool_call_parser(request("required"))
    assert parser.feed(WEATHER) + parser.close() == [ToolCallDelta(index=0, name="get_weather", arguments='{"city":"Paris"}')]


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
UNIT = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"]}
GRAMMAR_TOOLS = (ToolSpec("get_weather", "Weather", CITY), ToolSpec("search_web", "Search", None), ToolSpec("set_unit", "Unit", UNIT))


def alternatives(grammar: str) -> list[str]:
    """The tool names the grammar's ``tool-call`` rule lets the model write."""
    line = next(line for line in grammar.splitlines() if line.startswith("tool-call ::="))
    return re.findall(r'\\"name\\": \\"([\w-]+)\\"', line)


def test_no_grammar_unless_a_call_is_required() -> None:
    for policy in (ToolPolicy(), ToolPolicy(mode="none"), ToolPolicy(mode="auto", allowed=("get_weather",))):
        assert tool_call_grammar(GRAMMAR_TOOLS, policy, CallShape()) is None


def test_the_grammar_offers_only_allowed_tools() -> None:
    assert alternatives(tool_call_grammar(GRAMMAR_TOOLS, ToolPolicy(mode="required"), CallShape()) or "") == [
        "get_weather",
        "search_web",
        "set_unit",
    ]
    named = tool_call_grammar(GRAMMAR_TOOLS, ToolPolicy(mode="required", allowed=("set_unit",)), CallShape())
    assert alternatives(named or "") == ["set_unit"]
    assert '"\\"celsius\\"" | "\\"fahrenheit\\""' in (named or "")
    two = tool_call_grammar(GRAMMAR_TOOLS, ToolPolicy(mode="required", allowed=("search_web", "set_unit")), CallShape())
    assert alternatives(two or "") == ["search_web", "set_unit"]


def test_the_grammar_allows_several_calls_only_when_the_policy_does() -> None:
    def root(policy: ToolPolicy) -> str:
        return (tool_call_grammar(GRAMMAR_TOOLS, policy, CallShape()) or "").splitlines()[0]

    assert root(ToolPolicy(mode="required", parallel=False)) == "root ::= tool-call-block"
    assert root(ToolPolicy(mode="required", max_calls=1)) == "root ::= tool-call-block"
    assert root(ToolPolicy(mode="required", max_calls=3)).endswith("){0,2}")
    assert root(ToolPolicy(mode="required")).endswith(f"){{0,{MAX_FORCED_CALLS - 1}}}")
    assert root(ToolPolicy(mode="required", allowed=("search_web", "set_unit"))).endswith("}")
    assert root(ToolPolicy(mode="required", allowed=("search_web",))) == "root ::= tool-call-block"


def test_strings_in_grammars_exclude_raw_control_characters() -> None:
    tools = tool_call_grammar(GRAMMAR_TOOLS, ToolPolicy(mode="required"), CallShape()) or ""
    schema = output_grammar(OutputFormat(kind="json_schema", schema=CITY)) or ""

    for grammar in (tools, schema):
        [char] = [line for line in grammar.splitlines() if line.startswith("char ::= ")]
        assert char == JSON_CHAR_RULE and r"\x00-\x1F" in char


def test_call_shapes() -> None:
    assert call_shape(False) == CallShape()
    assert call_shape(True, (7, 8)) == CallShape(open='<[7]> "\\n"', close='"\\n" <[8]>', trigger=7)
    assert call_shape(True).open == '"<tool_call>\\n"' and call_shape(True).trigger is None
    grammar = tool_call_grammar(GRAMMAR_TOOLS, ToolPolicy(mode="required"), call_shape(True, (7, 8))) or ""
    assert 'tool-call-block ::= <[7]> "\\n" tool-call "\\n" <[8]>' in grammar


def test_the_lazy_grammar_takes_tagged_calls_as_forced_and_bare_ones_under_auto_only() -> None:
    tagged = call_shape(True, (7, 8))
    forced = tool_call_grammar(GRAMMAR_TOOLS, ToolPolicy(mode="required"), tagged)
    lazy = lazy_call_grammar(GRAMMAR_TOOLS, ToolPolicy(), tagged)
    assert forced and lazy
    assert lazy.split("\n")[0] == forced.split("\n")[0] + " | bare-calls"
    assert set(forced.split("\n")[1:]) <= set(lazy.split("\n"))
    assert lazy_call_grammar(GRAMMAR_TOOLS, ToolPolicy(mode="none"), tagged) is None
    assert lazy_call_grammar(GRAMMAR_TOOLS, ToolPolicy(mode="required"), tagged) is None
    for untokened in (call_shape(True), CallShape()):
        assert (lazy_call_grammar(GRAMMAR_TOOLS, ToolPolicy(), untokened) or "").startswith("root ::= bare-calls\n")
    assert lazy_call_grammar(GRAMMAR_TOOLS, ToolPolicy(allowed=("nothing",)), tagged) is None


def test_refs_of_different_tools_do_not_mix() -> None:
    def with_ref(name: str, target: dict) -> ToolSpec:
        schema = {"type": "object", "properties": {"v": {"$ref": "#/$defs/value"}}, "$defs": {"value": target}}
        return ToolSpec(name, parameters=schema)

    tools = (with_ref("a", {"enum": ["x"]}), with_ref("b", {"type": "integer"}))
    grammar = tool_call_grammar(tools, ToolPolicy(mode="required"), CallShape()) or ""

    assert 'tool0-ref-value ::= "\\"x\\""' in grammar
    assert "tool1-v ::= integer" in grammar and "tool1-v ::= tool0" not in grammar
    assert tools[0].parameters == {"type": "object", "properties": {"v": {"$ref": "#/$defs/value"}}, "$defs": {"value": {"enum": ["x"]}}}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"x": {"not": {"type": "string"}}}},
        {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}},
        {"type": "string"},
    ],
)
def test_a_schema_llama_cpp_cannot_convert_names_its_tool(schema: dict) -> None:
    tools = (ToolSpec("fine", parameters=CITY), ToolSpec("broken", parameters=schema))

    with pytest.raises(InvalidRequest) as raised:
        tool_call_grammar(tools, ToolPolicy(mode="required"), CallShape())
    assert raised.value.param == "tools[1].parameters"
    assert "broken" in raised.value.message
    assert tool_call_grammar(tools, ToolPolicy(mode="required", allowed=("fine",)), CallShape()) is not None


def test_a_policy_that_allows_none_of_the_tools_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest) as raised:
        tool_call_grammar(GRAMMAR_TOOLS, ToolPolicy(mode="required", allowed=("nope",)), CallShape())
    assert raised.value.param == "tool_choice"


CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_all_tools_are_rendered_whatever_the_policy() -> None:
    rendered = template_tools(GRAMMAR_TOOLS)

    assert [tool["function"]["name"] for tool in rendered or []] == ["get_weather", "search_web", "set_unit"]
    assert (rendered or [])[1]["function"] == {
        "name": "search_web",
        "description": "Search",
        "parameters": {"type": "object", "properties": {}},
    }
    assert template_tools(()) is None


def test_a_template_without_tools_gets_them_in_the_system_message() -> None:
    template = ChatTemplate(CHATML, bos_token="", eos_token="<|im_end|>")
    messages = (ChatMessage("system", "Be brief."), ChatMessage("user", "Weather in Paris?"))

    prompt = template.render(prompt_messages(messages, GRAMMAR_TOOLS, template_renders_tools=False))

    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '{"name": "set_unit", "description": "Unit", "parameters": {' in system
    assert system.endswith(TOOL_RESULT_HINT)
    assert prompt.count("<|im_start|>system") == 1


def test_the_tool_hint_is_added_only_with_tools_or_tool_results() -> None:
    plain = (ChatMessage("user", "Hi"),)
    assert prompt_messages(plain, (), template_renders_tools=True) == plain

    with_tools = prompt_messages(plain, GRAMMAR_TOOLS, template_renders_tools=True)
    assert with_tools == (ChatMessage("system", f"{DEFAULT_SYSTEM}\n\n{TOOL_RESULT_HINT}"), *plain)

    answered = (
        ChatMessage("developer", "Be brief."),
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", tool_calls=(ToolCall("c1", "get_weather", "{}"),)),
        ChatMessage("tool", "18C", tool_call_id="c1"),
    )
    assert prompt_messages(answered, (), template_renders_tools=True) == (
        ChatMessage("system", f"Be brief.\n\n{TOOL_RESULT_HINT}"),
        *answered[1:],
    )
