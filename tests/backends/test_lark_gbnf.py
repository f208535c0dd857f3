"""Lark grammars made into GBNF (:mod:`app.backends.lark_gbnf`): each construct accepts
exactly the JSON encodings of its language, judged by a GBNF recognizer of the tests'
own (``tests.backends.gbnf``); what cannot be held is refused saying why; and the whole
forcing grammar of a call (llama.cpp's JSON-schema converter included) holds a custom
tool's input to its grammar."""

from __future__ import annotations

import json

import pytest

from app.backends.base import TextGrammar, ToolPolicy, ToolSpec
from app.backends.call_syntax import CallShape, call_shape
from app.backends.grammar import MAX_GRAMMAR_REPEAT, check_text_grammars, tool_call_grammar
from app.backends.json_text_gbnf import Repeats
from app.backends.lark_gbnf import UnsupportedGrammar, lark_to_gbnf
from app.errors import InvalidRequest
from app.protocol.tools import custom_parameters
from tests.backends.gbnf import Grammar

# An edit format in the manner of Codex's apply_patch (this project's own text): rule
# references, alternatives, groups, `+` and `?`, an alias, string terminals, regular
# expressions that may match nothing, and a terminal imported from lark's library.
EDITS = r"""
start: opening section+ closing
opening: "%% edits" LF
closing: "%% done" LF?
section: creation | removal | change
creation: "%% new " path LF ("+" /(.*)/ LF)+
removal: "%% drop " path LF
change: "%% edit " path LF rename? (context | edit_line)+
rename: "%% to " path LF
context: ("@@" | "@@ " /(.+)/) LF
edit_line: ("+" | "-" | " ") /(.*)/ LF -> line
path: /(.+)/
%import common.LF
"""


def language(definition: str) -> Grammar:
    rules = lark_to_gbnf(definition, "t", Repeats(1000, 100_000))
    return Grammar("\n".join([f"root ::= {rules.root}", *rules.rules]))


def accepts(grammar: Grammar, text: str) -> bool:
    """Whether ``text``, written inside a JSON string, is in the grammar's language."""
    return grammar.matches(json.dumps(text, ensure_ascii=False)[1:-1])


def test_an_edit_format_like_apply_patch() -> None:
    edits = language(EDITS)
    good = [
        "%% edits\n%% new a.txt\n+hello\n+\n%% done\n",
        "%% edits\n%% drop old/b.py\n%% done",
        '%% edits\n%% edit src/c.py\n%% to src/d.py\n@@ def f():\n-    return "x"\n+    return \'y\'\n \tkept\n%% done\n',
        "%% edits\n%% edit é.md\n@@\n+ünïcode \\ back\\slash\n%% new e\n+x\n%% done\n",
    ]
    for text in good:
        assert accepts(edits, text), text
    bad = [
        "%% edits\n%% done\n",  # no section
        "%% edits\n%% new a.txt\n%% done\n",  # a new file without a line
        "%% edits\n%% drop a.txt\n",  # no closing
        "%% edits\n%% drop \n%% done\n",  # an empty path
        "%% edits\n%% edit a\n*oops\n%% done\n",  # a line of no kind
        "%% edits\n%% drop a.txt\n%% done\n\n",  # text after the end
    ]
    for text in bad:
        assert not accepts(edits, text), text


def test_the_text_is_held_in_its_json_encoding() -> None:
    """Raw newlines, quotes or backslashes would end or break the JSON string: only their
    escapes are allowed, and a control character only as ``\\u00XX``."""
    lines = language('start: /[^\\n]*/ "\\n"')
    assert lines.matches('say \\"hi\\" \\\\ \\t tab\\n')
    assert lines.matches("bell \\u0007\\n") and lines.matches("bell \\u001B\\n")
    assert not lines.matches('say "hi"\\n')  # a raw quote
    assert not lines.matches("one\ntwo\\n")  # a raw newline
    assert not lines.matches("one\\ntwo\\n")  # a newline the regex excludes, escaped
    assert not lines.matches("bell \x07\\n")  # a raw control character
    assert not lines.matches("line\\u000a")  # a newline by another name


@pytest.mark.parametrize(("definition", "inside", "outside"), [
    # alternatives and rule references
    ('start: a | b\na: "x"\nb: "y" "z"', ["x", "yz"], ["", "y", "xyz"]),
    # repetition, optional and groups
    ('start: "a"* ("b" "c")+ "d"?', ["bc", "aabcbcd"], ["", "a", "bcdd", "abd"]),
    ("start: [\"x\"] \"y\"", ["y", "xy"], ["x", "xxy"]),
    # bounded repetition
    ('start: "ab" ~ 2\n', ["abab"], ["ab", "ababab"]),
    ('start: "a" ~ 1..3', ["a", "aa", "aaa"], ["", "aaaa"]),
    # string terminals, case-insensitive ones, terminals of terminals
    ('start: "select"i " " NAME\nNAME: LETTER+\nLETTER: "a".."z"', ["SeLeCt abc"], ["select ", "select A1"]),
    # regular expressions: classes, counts, flags, escapes, alternatives
    ("start: /[a-c]{2,3}x?/", ["ab", "abcx"], ["a", "abcab", "abd"]),
    ("start: /(?i:ok)|no/", ["OK", "oK", "no"], ["NO", "ok!"]),
    (r"start: /\d+(\.\d+)?/", ["3", "3.14"], ["3.", ".5", "x"]),
    (r"start: /\w+\s\S/", ["a_1 !", "b\tc"], ["a  b", "a b c"]),
    ("start: /[^a-y]/", ["z", "é", '"', "\\", "\n"], ["a", "m"]),
    ('start: /a.c/s', ["abc", "a\nc"], ["ac"]),
    ('start: /a.c/', ["abc"], ["a\nc"]),
    # left recursion, as written by hand
    ('start: start "+" NUM | NUM\nNUM: /[0-9]/', ["1", "1+2+3"], ["+1", "1+"]),
    # %ignore: between any two symbols, and around the whole
    ('start: "a" "b" NUM\nNUM: /[0-9]+/\n%ignore " "', ["ab1", " a  b 12 "], ["a b1 2"]),
])
def test_constructs(definition: str, inside: list[str], outside: list[str]) -> None:
    grammar = language(definition)
    for text in inside:
        assert accepts(grammar, text), (definition, text)
    for text in outside:
        assert not accepts(grammar, text), (definition, text)


@pytest.mark.parametrize(("definition", "why"), [
    ('start: ("a"', "not a valid Lark grammar"),
    ('start: "a" b', "not a valid Lark grammar"),  # an undefined rule
    ('begin: "a"', "start"),
    ("start: /a(?=b)/", "look-ahead"),
    (r"start: /(a)\1/", "back-reference"),
    ("start: /^a$/", "anchor"),
    ("start: /a{5000}/", "5,000 times"),
    ('start: a "x"\na: start "y" | "z"', "left-recursive"),
    ('start: a\na: a', "never ends"),
    ("%import .local.NAME\nstart: NAME", "relative to a file"),
    ('%declare X\nstart: X', "declared"),
    # lark would expand this template forever
    ('start: t{A}\nt{x}: x | t{w{x}}\nw{y}: y y\nA: "a"', "template"),
    ('start: "a"\n%extend _t {x}: x', "template"),
])
def test_what_cannot_be_held_is_refused_saying_why(definition: str, why: str) -> None:
    with pytest.raises(UnsupportedGrammar, match=why):
        lark_to_gbnf(definition, "t", Repeats(MAX_GRAMMAR_REPEAT, 100_000))


def _tool(definition: str, index: int = 0) -> ToolSpec:
    return ToolSpec(name="edit", description="Edit files.", parameters=custom_parameters(None), strict=True,
                    grammar=TextGrammar("lark", definition, f"tools[{index}].format.definition"))


WEATHER = ToolSpec(name="weather", parameters={"type": "object", "properties": {"city": {"type": "string"}},
                                               "required": ["city"]})


@pytest.mark.parametrize("shape", [CallShape(), call_shape(True)])
def test_a_forced_call_of_the_tool_is_held_to_its_grammar(shape: CallShape) -> None:
    text = tool_call_grammar([WEATHER, _tool(EDITS, 1)], ToolPolicy(mode="required", allowed=("edit",)), shape)
    assert text is not None
    forced = Grammar(text)
    patch = "%% edits\n%% new a.txt\n+print(\"hi\")\n%% done\n"

    def call(input_text: str) -> str:
        body = '{"name": "edit", "arguments": {"input": ' + json.dumps(input_text, ensure_ascii=False) + "}}"
        return f"<tool_call>\n{body}\n</tool_call>" if shape.open else body

    assert forced.matches(call(patch))
    assert not forced.matches(call("%% edits\n%% done\n"))
    assert not forced.matches(call(patch).replace('"edit"', '"weather"', 1))


def test_a_request_with_a_grammar_that_cannot_be_held_is_refused_naming_it() -> None:
    tools = [WEATHER, _tool(EDITS, 1), _tool("start: /a(?=b)/", 2)]
    with pytest.raises(InvalidRequest) as refused:
        check_text_grammars(tools)
    assert (refused.value.param, refused.value.code) == ("tools[2].format.definition", "unsupported_grammar")
    assert "'edit'" in refused.value.message and "look-ahead" in refused.value.message
    check_text_grammars(tools[:2])
