"""Custom (free-form) tools, OpenAI's ``{"type": "custom", "format": ...}``, end to end
over HTTP. Not in the spec, so only a request that offers one gets its items: a call is
a ``custom_tool_call`` whose ``input`` is the text the model wrote, answered by a
``custom_tool_call_output``. Responses and events are judged by the vendored spec with
exactly these two item schemas added (``compliance.with_items``), so every other rule
still holds. The scripted models (named as such) show what the model was offered and
make calls on demand; SmolLM2 makes real calls held to a regex grammar and to a Lark
grammar."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from lark import Lark

from compliance.schemas import load_spec, with_items
from tests.client import Client
from tests.conftest import SMOL
from tests.live import LiveServer

_STATUS = {"type": "string", "enum": ["in_progress", "completed", "incomplete"]}
_TEXT = {"type": "string"}
SUPERSET = with_items(load_spec(), {
    "CustomToolCall": {
        "type": "object",
        "properties": {"type": {"enum": ["custom_tool_call"]}, "id": _TEXT, "call_id": _TEXT, "name": _TEXT,
                       "input": _TEXT, "status": _STATUS},
        "required": ["type", "id", "call_id", "name", "input", "status"],
        "additionalProperties": False,
    },
    "CustomToolCallOutput": {
        "type": "object",
        "properties": {"type": {"enum": ["custom_tool_call_output"]}, "id": _TEXT, "call_id": _TEXT,
                       "output": {"type": ["string", "array"]}, "status": _STATUS},
        "required": ["type", "id", "call_id", "output", "status"],
        "additionalProperties": False,
    },
})

PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch to files.",
         "format": {"type": "text"}}
ANSWER = {"type": "custom", "name": "answer", "description": "Answer yes or no.",
          "format": {"type": "grammar", "syntax": "regex", "definition": "yes|no"}}
LARK = {"type": "custom", "name": "query", "description": "Run a query.",
        "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "SELECT " /[a-z]+/'}}
PATCH_TEXT = "*** Begin Patch\n*** End Patch\n"


@pytest.fixture(scope="module")
def custom(server: LiveServer) -> Iterator[Client]:
    client = Client(server.url, spec=SUPERSET)
    yield client
    client.close()


def _items(response: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == kind]


def test_a_custom_call_comes_back_with_its_text_as_input(custom: Client, scripted) -> None:  # type: ignore[no-untyped-def]
    response = custom.create(model="scripted-custom-tool", input="Empty patch, please.", tools=[PATCH, LARK])

    offered, lark = scripted.requests[-1].tools
    assert (offered.name, offered.strict, offered.grammar) == ("apply_patch", True, None)
    assert offered.parameters["properties"]["input"]["type"] == "string"
    assert lark.name == "query" and lark.parameters["properties"]["input"] == offered.parameters["properties"]["input"]
    assert lark.grammar is not None  # with its grammar, for a backend that holds a model to it
    assert (lark.grammar.definition, lark.grammar.param) == (LARK["format"]["definition"], "tools[1].format.definition")
    [call] = _items(response, "custom_tool_call")
    assert (call["name"], call["input"], call["status"]) == ("apply_patch", PATCH_TEXT, "completed")
    assert call["id"].startswith("ctc_") and call["call_id"]
    assert response["tools"] == []  # the spec's tools field holds function tools only


def test_a_streamed_custom_call_has_its_item_events_and_no_argument_deltas(custom: Client) -> None:
    result = custom.stream(model="scripted-custom-tool", input="Patch.", tools=[PATCH])
    assert not [kind for kind in result.types() if "arguments" in kind]
    items = [event["item"] for event in result.events if event["type"].startswith("response.output_item.")]
    assert [(item["type"], item["status"], item["input"]) for item in items] == [
        ("custom_tool_call", "in_progress", ""), ("custom_tool_call", "completed", PATCH_TEXT)]


def test_an_input_outside_the_regex_never_reaches_the_client(custom: Client) -> None:
    response = custom.create(model="scripted-custom-maybe", input="Well?", tools=[ANSWER])
    assert response["status"] == "completed" and not _items(response, "custom_tool_call")


def test_the_tool_loop_answers_a_custom_call(custom: Client, scripted) -> None:  # type: ignore[no-untyped-def]
    first = custom.create(model="scripted-custom-tool", input="Patch.", tools=[PATCH])
    call = _items(first, "custom_tool_call")[0]
    answer = {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "Done!"}

    by_chain = custom.create(model="scripted-text", previous_response_id=first["id"], tools=[PATCH],
                             input=[answer])
    assert by_chain["status"] == "completed"
    seen = scripted.requests[-1].messages
    assert json.loads(seen[-2].tool_calls[0].arguments) == {"input": PATCH_TEXT}
    assert (seen[-1].role, seen[-1].content, seen[-1].tool_call_id) == ("tool", "Done!", call["call_id"])

    resent = custom.create(model="scripted-text", store=False, tools=[PATCH],
                           input=[{"role": "user", "content": "Patch."}, call, answer])
    assert resent["status"] == "completed"
    listed = custom.http.get(f"/v1/responses/{by_chain['id']}/input_items").json()
    assert listed["data"][0]["type"] == "custom_tool_call_output"


def test_the_gate_holds_custom_outputs_to_their_calls(custom: Client) -> None:
    call = {"type": "custom_tool_call", "call_id": "call_c1", "name": "answer", "input": "maybe",
            "status": "completed"}
    output = {"type": "custom_tool_call_output", "call_id": "call_c1", "output": "ok"}
    question = {"role": "user", "content": "Well?"}

    error = custom.error({"model": "scripted-text", "tools": [ANSWER], "input": [question, call, output]}, 400)
    assert (error["code"], error["param"]) == ("arguments_schema", "input[2]")  # "maybe" is not yes|no

    function_call = {"type": "function_call", "call_id": "call_c1", "name": "answer", "arguments": "{}"}
    error = custom.error({"model": "scripted-text", "input": [question, function_call, output]}, 400)
    assert (error["code"], error["param"]) == ("not_function_call", "input[2]")

    error = custom.error({"model": "scripted-text", "input": [question, output]}, 400)
    assert error["code"] == "call_id"


def test_a_regex_that_cannot_run_in_linear_time_is_refused(custom: Client) -> None:
    broken = {**ANSWER, "format": {"type": "grammar", "syntax": "regex", "definition": "(?=yes)yes"}}
    error = custom.error({"model": "scripted-text", "input": "hi", "tools": [PATCH, broken]}, 400)
    assert (error["code"], error["param"]) == ("invalid_tool_schema", "tools[1].format.definition")


def test_the_embedded_model_is_held_to_the_regex(custom: Client) -> None:
    """SmolLM2, forced to call the tool (OpenAI's ``{"type": "custom"}`` choice): the
    grammar from the regex leaves it only ``yes`` or ``no``."""
    response = custom.create(model=SMOL, input="Is the sky blue?", tools=[ANSWER],
                             tool_choice={"type": "custom", "name": "answer"}, max_output_tokens=32)
    [call] = _items(response, "custom_tool_call")
    assert call["name"] == "answer" and call["input"] in ("yes", "no")


def test_required_with_only_tools_that_cannot_be_offered_says_why(custom: Client) -> None:
    error = custom.error({"model": "scripted-text", "input": "x", "tool_choice": "required",
                          "tools": [{"type": "web_search"}, {"type": "file_search"}]}, 400)
    assert error["param"] == "tool_choice"
    assert "'web_search', 'file_search'" in error["message"] and "custom tools" in error["message"], error
    bare = custom.error({"model": "scripted-text", "input": "x", "tool_choice": "required"}, 400)
    assert "no tools were given" in bare["message"]


# A small edit format of this project's own, in the manner of Codex's apply_patch, with a
# finite language (so that a 135M model, held to it, ends): string terminals, rule
# references, alternatives, a bounded repeat, a regular expression, an imported terminal.
EDITS_GRAMMAR = r"""
start: "BEGIN" LF entry ~ 1..2 "END"
entry: ("add" | "drop") " " FILE LF
FILE: /[a-z]{1,8}\.txt/
%import common.LF
"""
EDITS = {"type": "custom", "name": "edit_files", "description": "Edit files; one entry a line.",
         "format": {"type": "grammar", "syntax": "lark", "definition": EDITS_GRAMMAR}}


def test_the_embedded_model_is_held_to_a_lark_grammar(custom: Client) -> None:
    """SmolLM2, forced to call the tool, writes an input of the grammar's language, as
    lark's own parser of the same grammar judges."""
    response = custom.create(model=SMOL, input="Add notes.txt please.", tools=[PATCH, EDITS],
                             tool_choice={"type": "custom", "name": "edit_files"}, max_output_tokens=200)
    assert response["status"] == "completed", response
    [call] = _items(response, "custom_tool_call")
    assert call["name"] == "edit_files"
    Lark(EDITS_GRAMMAR).parse(call["input"])  # raises if the input is not in the language


def test_a_lark_grammar_the_embedded_model_cannot_be_held_to_is_a_400(custom: Client, scripted) -> None:  # type: ignore[no-untyped-def]
    """Refused naming the tool's grammar, whatever the tool choice; a backend that does
    not hold the model to it itself (the scripted model, as an upstream) gets the tool."""
    ahead = {**LARK, "format": {**LARK["format"], "definition": 'start: /a(?=b)/ "b"'}}
    error = custom.error({"model": SMOL, "input": "x", "tools": [PATCH, ahead]}, 400)
    assert (error["param"], error["code"]) == ("tools[1].format.definition", "unsupported_grammar")
    assert "'query'" in error["message"] and "look-ahead" in error["message"]
    invalid = {**LARK, "format": {**LARK["format"], "definition": "start: (("}}
    error = custom.error({"model": SMOL, "input": "x", "tools": [invalid]}, 400)
    assert error["param"] == "tools[0].format.definition" and "not a valid Lark grammar" in error["message"]

    custom.create(model="scripted-text", input="x", tools=[PATCH, ahead])
    assert [tool.name for tool in scripted.requests[-1].tools] == ["apply_patch", "query"]
