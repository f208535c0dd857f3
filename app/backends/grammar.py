"""The GBNF grammars that constrain a local model's output, built from JSON Schema.

llama.cpp samples under a GBNF grammar; llama-cpp-python's JSON-schema converter turns a
schema into one. Two grammars are built here, each checked first (:class:`RepeatBudget`)
so that no schema makes a grammar the parser cannot hold:

* :func:`output_grammar` enforces ``text.format`` (any JSON for ``json_object``, the
  schema for ``json_schema``);
* :func:`tool_call_grammar` forces a call, for ``tool_choice: required``, a named
  function, or ``allowed_tools`` with mode ``required``. Its arguments follow each
  allowed tool's ``parameters``, and the model may write only calls to allowed tools, in
  its native shape (:mod:`app.backends.call_syntax`): tagged calls for a template with a
  tools section, bare objects otherwise. Several calls are allowed when the policy
  permits, up to ``MAX_FORCED_CALLS``, except when a single tool is allowed: that is how
  a named function arrives, and a named function is called exactly once;
* :func:`lazy_call_grammar` is the same grammar under ``auto``, for llama.cpp to apply
  only once the model opens a call (``grammar_lazy``): with its single tag token, or,
  where the parser takes a bare or fenced call (the start of the answer), once the text
  so far is an optional fence and ``{"name":`` (:data:`BARE_CALL_TRIGGER`); the text
  before is free, the call is held to the tools. The output parser
  (:mod:`app.backends.toolcalls`) enforces the policy on every call either way.

A custom tool's Lark grammar (:class:`~app.backends.base.TextGrammar`) holds its input
instead (:mod:`app.backends.lark_gbnf`): the call's arguments are ``{"input": "..."}``
with the string's text in the grammar's language. Every such grammar of a request is
converted (:func:`check_text_grammars`), forced or not, so one that cannot be is refused
whatever ``tool_choice`` says.

A schema the converter cannot turn into a grammar is refused with ``InvalidRequest``
(``param`` ``text.format.schema`` or ``tools[i].parameters``; a Lark grammar,
``tools[i].format.definition``) rather than generated unconstrained. The converter is
imported on first use, so that importing this module does not load llama.cpp (``local``
configures the process before it does).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Any

from app.backends.base import OutputFormat, ToolPolicy, ToolSpec
from app.backends.call_syntax import FENCE, FENCE_LABELS, CallShape, gbnf_literal
from app.backends.json_text_gbnf import Repeats
from app.backends.lark_gbnf import GbnfRules, UnsupportedGrammar, lark_to_gbnf
from app.errors import InvalidRequest

MAX_FORCED_CALLS = 8
"""Calls a forcing grammar allows when the policy sets no lower limit."""

CALL_SPACE = "[ \\t\\n]"
"""The whitespace a bare call may have between its tokens, as a character class of both
GBNF and the trigger's regular expression (they must accept the same text)."""

BARE_CALL_TRIGGER = (
    rf'^{CALL_SPACE}*(?:{FENCE}(?:{"|".join(label for label in FENCE_LABELS if label)})?{CALL_SPACE}*)?'
    rf'(\{{){CALL_SPACE}*"name"{CALL_SPACE}*:{CALL_SPACE}*"?$'
)
"""When the lazy grammar of a bare or fenced call starts to hold (llama.cpp's
``COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL``: the whole text generated so far matches):
at the start of the answer, after an optional opening fence, an object's first key
``"name"`` and its colon. The grammar is given the text from the brace (the first
group) on, which its bare call accepts whatever the spacing; a token that runs past the
colon into more than the opening quote never matches, and the call stays free as
before. The name is then held to the tools."""

CUSTOM_ARGUMENTS = ('{"input": "', '"}')
"""What the arguments of a call held to a custom tool's grammar are around its one string
(the parameter custom tools are offered with, ``app.protocol.tools.CUSTOM_INPUT``)."""


def output_grammar(output_format: OutputFormat) -> str | None:
    """The GBNF grammar that enforces ``output_format``, or ``None`` for free text.

    Raises ``InvalidRequest`` (``param="text.format.schema"``) for a JSON schema that
    llama.cpp's converter cannot turn into a grammar, instead of generating unconstrained.
    """
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    if output_format.kind == "text":
        return None
    if output_format.kind == "json_object" or output_format.schema is None:
        return JSON_GBNF
    too_many = RepeatBudget().spend(output_format.schema)
    if too_many is not None:
        raise unsupported_schema(too_many)
    try:
        return strict_json_strings(json_schema_to_gbnf(json.dumps(output_format.schema)))
    except Exception as exc:  # the converter raises assorted errors (assertions included)
        raise unsupported_schema(str(exc)) from exc


JSON_CHAR_RULE = (r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | '
                  r'"u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])')
"""A character of a JSON string: raw control characters excluded, as JSON requires."""


def strict_json_strings(grammar: str) -> str:
    """``grammar`` (from llama.cpp's JSON-schema converter) with its ``char`` rule replaced
    by ``JSON_CHAR_RULE``: the converter's own lets raw control characters (a newline)
    into strings, and the output would not parse as JSON."""
    return "\n".join(JSON_CHAR_RULE if line.startswith("char ::= ") else line for line in grammar.splitlines())


MAX_GRAMMAR_REPEAT = 1_000
"""The largest count a grammar enforces: a string's ``minLength``/``maxLength``, an
array's ``minItems``/``maxItems``, a ``{m,n}`` repetition in a ``pattern``.
llama-cpp-python's converter spells ``maxLength: n`` as ``n`` nested optional groups:
llama.cpp's grammar parser accepts 1,000 levels, refuses deeper nesting, and far deeper
overflows its stack, which kills the process. A count of 10**9 would first build a
grammar of gigabytes. So counts are checked before a schema is converted."""

MAX_GRAMMAR_REPEATS = 100_000
"""All the counts of one grammar together (every tool of it): its size grows with their
sum."""

_COUNTS = frozenset({"minLength", "maxLength", "minItems", "maxItems"})
_QUANTIFIER = re.compile(r"\{(\d+)(?:,(\d*))?\}")


class RepeatBudget:
    """What the grammars of one request may repeat (see :data:`MAX_GRAMMAR_REPEAT`)."""

    def __init__(self) -> None:
        self.spent = 0

    def spend(self, schema: Any) -> str | None:
        """Count ``schema``'s repetitions; why it asks for more than a grammar can hold,
        or ``None``."""
        stack = [schema]
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(node)
                continue
            if not isinstance(node, dict):
                continue
            for key, value in node.items():
                if key in _COUNTS and isinstance(value, int) and not isinstance(value, bool):
                    counts = [value]
                elif key == "pattern" and isinstance(value, str):
                    counts = [_count(digits) for match in _QUANTIFIER.finditer(value) for digits in match.groups()
                              if digits]
                else:
                    stack.append(value)
                    continue
                for count in counts:
                    if count > MAX_GRAMMAR_REPEAT:
                        return (f"{key} asks for {'more than 1,000,000' if count > 1_000_000 else f'{count:,}'} "
                                f"repetitions; a grammar enforces at most {MAX_GRAMMAR_REPEAT:,}")
                    self.spent += count
        if self.spent > MAX_GRAMMAR_REPEATS:
            return (f"its lengths, item counts and pattern repetitions add up to {self.spent:,}; "
                    f"a grammar enforces at most {MAX_GRAMMAR_REPEATS:,} in all")
        return None


def _count(digits: str) -> int:
    return int(digits) if len(digits) <= 7 else 10**7  # never parse an endless number


def unsupported_schema(reason: str) -> InvalidRequest:
    return InvalidRequest(
        f"The local model cannot enforce this JSON schema: {reason or 'unsupported construct'}",
        param="text.format.schema",
    )


def tool_call_grammar(tools: Sequence[ToolSpec], policy: ToolPolicy, shape: CallShape) -> str | None:
    """The GBNF grammar that forces calls to allowed tools; ``None`` unless one is required.

    Raises ``InvalidRequest`` (``param="tools[i].parameters"``) for a parameters schema
    that llama.cpp's converter cannot turn into a grammar, and (``param="tool_choice"``)
    when the policy allows none of the tools.
    """
    if policy.mode != "required":
        return None
    grammar = _calls_grammar(tools, policy, shape)
    if grammar is None:
        raise InvalidRequest("tool_choice requires a call, but allows none of the tools given.", param="tool_choice")
    return grammar


def lazy_call_grammar(tools: Sequence[ToolSpec], policy: ToolPolicy, shape: CallShape) -> str | None:
    """Under ``auto``, a grammar for llama.cpp to apply lazily: calls to the allowed tools
    with their arguments, opened with the tag token (``shape.trigger``, as
    :func:`tool_call_grammar` writes them) or bare or fenced, once
    :data:`BARE_CALL_TRIGGER` matched (from the object's brace on, whatever its spacing;
    several calls as the policy allows; a closing fence at the end). ``None`` for another
    mode, or when no tool may be called. Raises as :func:`tool_call_grammar` does for a
    schema it cannot convert."""
    if policy.mode != "auto":
        return None
    return _calls_grammar(tools, policy, shape, lazy=True)


def _calls_grammar(tools: Sequence[ToolSpec], policy: ToolPolicy, shape: CallShape, *,
                   lazy: bool = False) -> str | None:
    """One or more calls to the tools ``policy`` allows, in ``shape`` (and ``lazy``, as
    :func:`lazy_call_grammar` takes them); ``None`` when it allows none of them."""
    converter = _Converter()
    alternatives: list[str] = []
    bare: list[str] = []
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        if tool.name in seen or not policy.may_call(tool.name):
            continue
        seen.add(tool.name)
        arguments = converter.arguments_rule(tool, index)
        prefix = '{"name": ' + json.dumps(tool.name) + ', "arguments": '
        alternatives.append(f'{gbnf_literal(prefix)} {arguments} "}}"')
        name = gbnf_literal(json.dumps(tool.name))
        bare.append(f'"{{" call-space "\\"name\\"" call-space ":" call-space {name} call-space "," '
                    f'call-space "\\"arguments\\"" call-space ":" call-space {arguments} call-space "}}"')
    if not alternatives:
        return None
    limits = [MAX_FORCED_CALLS] + ([policy.max_calls] if policy.max_calls is not None else [])
    named = policy.allowed is not None and len(set(policy.allowed)) == 1
    count = max(1, min(limits)) if policy.parallel and not named else 1
    block = " ".join(part for part in (shape.open, "tool-call", shape.close) if part)
    more = f" ( {shape.separator} tool-call-block ){{0,{count - 1}}}" if count > 1 else ""
    tagged = [f"tool-call-block{more}"] if not lazy or shape.trigger is not None else []
    rules = [
        f"tool-call-block ::= {block}",
        "tool-call ::= " + " | ".join(alternatives),
    ]
    if lazy:
        labels = " | ".join(gbnf_literal(label) for label in FENCE_LABELS if label)
        fence = gbnf_literal(FENCE)
        again = f" ( bare-call-next bare-call ){{0,{count - 1}}}" if count > 1 else ""
        rules += [
            f"bare-calls ::= bare-call{again} call-space {fence}?",
            f"bare-call-next ::= call-space ( {fence} call-space {fence} ( {labels} )? call-space )?",
            "bare-call ::= " + " | ".join(bare),
            f"call-space ::= {CALL_SPACE}*",
        ]
    root = " | ".join([*tagged, *(["bare-calls"] if lazy else [])])
    return "\n".join([f"root ::= {root}", *rules, converter.format_grammar()])


def check_text_grammars(tools: Sequence[ToolSpec]) -> None:
    """Raise ``InvalidRequest`` (``param`` the grammar's) for the first tool whose Lark
    grammar cannot become GBNF."""
    for index, tool in enumerate(tools):
        if tool.grammar is not None:
            text_grammar_rules(tool, f"tool{index}")


def text_grammar_rules(tool: ToolSpec, prefix: str) -> GbnfRules:
    """The GBNF rules of ``tool``'s Lark grammar, named ``<prefix>-...``."""
    assert tool.grammar is not None
    try:
        return _lark_rules(tool.grammar.definition, prefix)
    except UnsupportedGrammar as refused:
        raise InvalidRequest(
            f"The local model cannot be held to the Lark grammar of custom tool '{tool.name}': {refused}.",
            code="unsupported_grammar",
            param=tool.grammar.param,
        ) from None


@functools.lru_cache(maxsize=64)
def _lark_rules(definition: str, prefix: str) -> GbnfRules:
    """Cached: a client sends the same tools with every turn."""
    return lark_to_gbnf(definition, prefix, Repeats(MAX_GRAMMAR_REPEAT, MAX_GRAMMAR_REPEATS))


class _Converter:
    """llama.cpp's JSON-schema converter, shared by all tools of one grammar.

    Each tool's rules are named after its position (``tool0-...``), including the rules
    made for ``$ref`` targets: the converter names such a rule after the reference's last
    path segment, so each tool's references are first given targets of their own
    (:func:`_own_references`), and tools never share a rule by a name they both use.
    """

    def __init__(self) -> None:
        from llama_cpp.llama_grammar import SchemaConverter  # loads llama.cpp: on first use only

        self._converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        self._repeats = RepeatBudget()  # one for every tool of the grammar
        self._text_rules: list[str] = []

    def arguments_rule(self, tool: ToolSpec, index: int) -> str:
        """The name of the rule for ``tool``'s arguments object."""
        prefix = f"tool{index}"
        if tool.grammar is not None:
            text = text_grammar_rules(tool, prefix)
            name = f"{prefix}-arguments"
            opening, closing = gbnf_literal(CUSTOM_ARGUMENTS[0]), gbnf_literal(CUSTOM_ARGUMENTS[1])
            self._text_rules += [*text.rules, f"{name} ::= {opening} {text.root} {closing}"]
            return name
        schema = tool.parameters or {"type": "object", "properties": {}}
        try:
            if not isinstance(schema, dict) or schema.get("type", "object") != "object":
                raise ValueError("the parameters must be a JSON schema of type 'object'")
            too_many = self._repeats.spend(schema)
            if too_many is not None:
                raise ValueError(too_many)
            resolved = self._converter.resolve_refs(_own_references(schema, prefix), prefix)
            return str(self._converter.visit(resolved, prefix))
        except Exception as exc:  # the converter raises assorted errors (assertions included)
            raise InvalidRequest(
                f"The local model cannot enforce the parameters schema of tool '{tool.name}': "
                f"{exc or 'unsupported construct'}",
                param=f"tools[{index}].parameters",
            ) from exc

    def format_grammar(self) -> str:
        return "\n".join([strict_json_strings(str(self._converter.format_grammar())), *self._text_rules])


def _own_references(schema: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A copy of ``schema`` whose every ``$ref`` points at a target of its own, named
    ``<prefix>-ref-<last segment of the reference>`` (a number added when two references
    of the schema end alike) and kept under a key of the root. Only references within
    the document (``#/...``) are supported, as by the converter; ``ValueError`` for any
    other, or for one that points at nothing."""
    from llama_cpp.llama_grammar import INVALID_RULE_CHARS_RE  # what a rule name cannot hold

    home = f"${prefix}-refs"
    while home in schema:
        home += "-"
    names: dict[str, str] = {}
    targets: dict[str, Any] = {}

    def target(reference: str) -> str:
        if reference not in names:
            if not reference.startswith("#/"):
                raise ValueError(f"Unsupported ref {reference}")
            node: Any = schema
            for key in reference[2:].split("/"):
                if not isinstance(node, dict) or key not in node:
                    raise ValueError(f"Error resolving ref {reference}: {key} not in {node}")
                node = node[key]
            base = f"{prefix}-ref-{INVALID_RULE_CHARS_RE.sub('-', reference.split('/')[-1])}"
            name, count = base, 1
            while name in targets:
                count += 1
                name = f"{base}-{count}"
            names[reference] = name
            targets[name] = None  # taken before its content is copied: it may refer to itself
            targets[name] = copied(node)
        return f"#/{home}/{names[reference]}"

    def copied(node: Any) -> Any:
        if isinstance(node, list):
            return [copied(value) for value in node]
        if not isinstance(node, dict):
            return node
        out = {key: copied(value) for key, value in node.items()}
        if isinstance(node.get("$ref"), str):
            out["$ref"] = target(node["$ref"])
        return out

    own = copied(schema)
    own[home] = targets
    return own
