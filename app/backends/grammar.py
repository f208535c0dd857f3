"""The GBNF grammar that forces a local model to call a tool, built from JSON Schema.

For ``tool_choice: required``, a named function, or ``allowed_tools`` with mode
``required``, :func:`tool_call_grammar` builds a grammar (arguments follow each allowed
tool's ``parameters`` through llama.cpp's JSON-schema conversion) that lets the model
write only calls to allowed tools, in its native shape (:mod:`app.backends.call_syntax`):
tagged calls for a template with a tools section, bare objects otherwise. Several calls
are allowed when the policy permits, up to ``MAX_FORCED_CALLS``, except when a single
tool is allowed: that is how a named function arrives, and a named function is called
exactly once. Under ``auto`` generation is free and the output parser
(:mod:`app.backends.toolcalls`) alone enforces the policy. The converter is imported on
first use, so that importing this module does not load llama.cpp.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Sequence

from app.backends.base import ToolPolicy, ToolSpec
from app.backends.call_syntax import CallShape, gbnf_literal
from app.backends.prompting import RepeatBudget, strict_json_strings
from app.errors import InvalidRequest

MAX_FORCED_CALLS = 8
"""Calls a forcing grammar allows when the policy sets no lower limit."""


def tool_call_grammar(tools: Sequence[ToolSpec], policy: ToolPolicy, shape: CallShape) -> str | None:
    """The GBNF grammar that forces calls to allowed tools; ``None`` unless one is required.

    Raises ``InvalidRequest`` (``param="tools[i].parameters"``) for a parameters schema
    that llama.cpp's converter cannot turn into a grammar, and (``param="tool_choice"``)
    when the policy allows none of the tools.
    """
    if policy.mode != "required":
        return None
    converter = _Converter()
    alternatives: list[str] = []
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        if tool.name in seen or not policy.may_call(tool.name):
            continue
        seen.add(tool.name)
        arguments = converter.arguments_rule(tool, index)
        prefix = '{"name": ' + json.dumps(tool.name) + ', "arguments": '
        alternatives.append(f'{gbnf_literal(prefix)} {arguments} "}}"')
    if not alternatives:
        raise InvalidRequest("tool_choice requires a call, but allows none of the tools given.", param="tool_choice")
    limits = [MAX_FORCED_CALLS] + ([policy.max_calls] if policy.max_calls is not None else [])
    named = policy.allowed is not None and len(set(policy.allowed)) == 1
    count = max(1, min(limits)) if policy.parallel and not named else 1
    block = " ".join(part for part in (shape.open, "tool-call", shape.close) if part)
    more = f" ( {shape.separator} tool-call-block ){{0,{count - 1}}}" if count > 1 else ""
    rules = [
        f"root ::= tool-call-block{more}",
        f"tool-call-block ::= {block}",
        "tool-call ::= " + " | ".join(alternatives),
    ]
    return "\n".join([*rules, converter.format_grammar()])


class _Converter:
    """llama.cpp's JSON-schema converter, shared by all tools of one grammar.

    Each tool's rules are named after its position (``tool0-...``), including the rules
    made for ``$ref`` targets, which the converter would otherwise share between tools by
    their last path segment.
    """

    def __init__(self) -> None:
        self._converter = _converter_class()(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        self._repeats = RepeatBudget()  # one for every tool of the grammar

    def arguments_rule(self, tool: ToolSpec, index: int) -> str:
        """The name of the rule for ``tool``'s arguments object."""
        schema = copy.deepcopy(tool.parameters) if tool.parameters else {"type": "object", "properties": {}}
        converter = self._converter
        converter.prefix = f"tool{index}"
        try:
            if not isinstance(schema, dict) or schema.get("type", "object") != "object":
                raise ValueError("the parameters must be a JSON schema of type 'object'")
            too_many = self._repeats.spend(schema)
            if too_many is not None:
                raise ValueError(too_many)
            resolved = converter.resolve_refs(schema, f"tool{index}")
            return str(converter.visit(resolved, f"tool{index}"))
        except Exception as exc:  # the converter raises assorted errors (assertions included)
            raise InvalidRequest(
                f"The local model cannot enforce the parameters schema of tool '{tool.name}': "
                f"{exc or 'unsupported construct'}",
                param=f"tools[{index}].parameters",
            ) from exc

    def format_grammar(self) -> str:
        return strict_json_strings(str(self._converter.format_grammar()))


@functools.cache
def _converter_class() -> type:
    """The converter, with per-tool names for ``$ref`` rules. Imported on first use, so
    that importing this module does not load llama.cpp."""
    from llama_cpp.llama_grammar import INVALID_RULE_CHARS_RE, SchemaConverter

    class Converter(SchemaConverter):  # type: ignore[misc]
        prefix = ""

        def _resolve_ref(self, ref: str) -> str:
            ref_name = INVALID_RULE_CHARS_RE.sub("-", f"{self.prefix}-ref-{ref.split('/')[-1]}")
            if ref_name not in self._rules and ref not in self._refs_being_resolved:
                self._refs_being_resolved.add(ref)
                ref_name = self.visit(self._refs[ref], ref_name)
                self._refs_being_resolved.remove(ref)
            return ref_name

    return Converter
