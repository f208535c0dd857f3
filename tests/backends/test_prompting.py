from __future__ import annotations

import pytest
from llama_cpp.llama_grammar import JSON_GBNF

from app.backends.base import ChatMessage, OutputFormat, ToolCall, ToolSpec
from app.backends.prompting import TOOL_RESULT_HINT, ChatTemplate, output_grammar, prompt_messages, template_messages
from app.errors import InvalidRequest

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WEATHER = ToolSpec(
    name="get_weather",
    description="Weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
SEARCH = ToolSpec(name="search_web")


def test_developer_becomes_system_and_each_system_message_stays_a_turn() -> None:
    messages = (
        ChatMessage("system", "Be brief."),
        ChatMessage("developer", "Answer in French."),
        ChatMessage("user", "Hi"),
        ChatMessage("developer", "Later instruction."),
    )

    assert template_messages(messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "Later instruction."},
    ]
    assert template_messages(messages, merge_system=True)[:2] == [
        {"role": "system", "content": "Be brief.\n\nAnswer in French."},
        {"role": "user", "content": "Hi"},
    ]


FIRST_SYSTEM_ONLY = (
    "{% for message in messages %}{% if message['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System role only first') }}{% endif %}"
    "{{ '<' + message['role'] + '>' + message['content'] }}{% endfor %}"
)


def test_a_template_that_takes_one_system_message_gets_the_leading_ones_merged() -> None:
    template = ChatTemplate(FIRST_SYSTEM_ONLY, bos_token="", eos_token="")

    prompt = template.render((ChatMessage("system", "A."), ChatMessage("developer", "B."), ChatMessage("user", "Hi")))

    assert prompt == "<system>A.\n\nB.<user>Hi"
    with pytest.raises(InvalidRequest, match="System role only first"):
        template.render((ChatMessage("user", "Hi"), ChatMessage("system", "Late.")))


def test_more_system_messages_extend_the_prompt_of_the_first_with_its_tools() -> None:
    """An agent's warm-up sends its instructions and tools; its first turn adds system
    messages (permissions, environment) and the task: the warm-up's prompt, but for the
    assistant's opening, is where the turn's begins, so its cache holds."""
    template = ChatTemplate(CHATML, bos_token="", eos_token="<|im_end|>")
    tools = (WEATHER,)
    opening = "<|im_start|>assistant\n"

    def render(*messages: ChatMessage) -> str:
        return template.render(prompt_messages(messages, tools, template_renders_tools=False))

    warm_up = render(ChatMessage("developer", "You are an agent."))
    turn = render(ChatMessage("developer", "You are an agent."), ChatMessage("developer", "Sandbox: read-only."),
                  ChatMessage("user", "Hi"))
    assert warm_up.endswith(opening) and turn.startswith(warm_up.removesuffix(opening))
    assert "get_weather" in warm_up and TOOL_RESULT_HINT in warm_up
    assert turn.count(TOOL_RESULT_HINT) == 1 and turn.index("Sandbox") > turn.index(TOOL_RESULT_HINT)


def test_tool_calls_and_results_take_the_openai_shape() -> None:
    messages = (
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
        ChatMessage("tool", '{"temp_c": 18}', tool_call_id="call_1"),
    )

    _, assistant, tool = template_messages(messages)
    assert assistant == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    }
    assert tool == {"role": "tool", "content": '{"temp_c": 18}', "tool_call_id": "call_1"}


def test_arguments_that_are_not_json_stay_a_string() -> None:
    message = ChatMessage("assistant", tool_calls=(ToolCall("c", "f", "not json"),))

    assert template_messages((message,))[0]["tool_calls"][0]["function"]["arguments"] == "not json"


def test_chat_template_renders_a_generation_prompt() -> None:
    template = ChatTemplate(CHATML, bos_token="", eos_token="<|im_end|>")

    prompt = template.render((ChatMessage("developer", "Be brief."), ChatMessage("user", "Hi")))

    assert prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_rejects_the_conversation_gives_invalid_request() -> None:
    template = ChatTemplate("{{ raise_exception('roles must alternate') }}", bos_token="", eos_token="")

    with pytest.raises(InvalidRequest, match="roles must alternate"):
        template.render((ChatMessage("user", "Hi"),))


def test_output_grammar_by_format() -> None:
    assert output_grammar(OutputFormat()) is None
    assert output_grammar(OutputFormat(kind="json_object")) == JSON_GBNF
    grammar = output_grammar(OutputFormat(kind="json_schema", schema={"type": "object", "properties": {"a": {"type": "integer"}}}))
    assert grammar is not None and "root ::=" in grammar and '\\"a\\"' in grammar


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"x": {"not": {"type": "string"}}}},
        {"type": "no-such-type"},
        {"$ref": "#/$defs/missing"},
        {"$ref": "https://example.com/remote.json"},
    ],
)
def test_a_schema_llama_cpp_cannot_convert_is_an_invalid_request(schema: dict) -> None:
    with pytest.raises(InvalidRequest) as raised:
        output_grammar(OutputFormat(kind="json_schema", name="s", schema=schema))
    assert raised.value.param == "text.format.schema"
