"""How a local model writes a tool call, the one definition its parser and its grammars share.

The local models have no tool-call channel: a call is text, one JSON object
``{"name": ..., "arguments": {...}}``. A template with a tools section (Qwen's) asks for
it between ``<tool_call>`` tags; other models write it bare, or in a fenced block (three
backticks and an optional label of :data:`FENCE_LABELS`). :mod:`app.backends.toolcalls`
recognises these shapes in what a model writes; :class:`CallShape` is the native one as
GBNF, around which :mod:`app.backends.grammar` forces a call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

TAG_OPEN = "<tool_call>"
TAG_CLOSE = "</tool_call>"
FENCE = "```"
FENCE_LABELS = ("", "json", "tool_call")


@dataclass(frozen=True, slots=True)
class CallShape:
    """How a model writes a call natively, as GBNF expressions around the JSON object."""

    open: str = ""
    close: str = ""
    separator: str = r'"\n"'
    trigger: int | None = None
    """The single vocabulary token that opens a call (``<tool_call>``), if there is one:
    what a lazy grammar waits for (:func:`app.backends.grammar.lazy_call_grammar`)."""


def call_shape(template_renders_tools: bool, tag_tokens: tuple[int, int] | None = None) -> CallShape:
    """Tagged calls for a template with a tools section (as the vocabulary's single tag
    tokens when it has them), bare JSON objects otherwise."""
    if not template_renders_tools:
        return CallShape()
    if tag_tokens is not None:
        return CallShape(open=rf'<[{tag_tokens[0]}]> "\n"', close=rf'"\n" <[{tag_tokens[1]}]>',
                         trigger=tag_tokens[0])
    return CallShape(open=gbnf_literal(TAG_OPEN + "\n"), close=gbnf_literal("\n" + TAG_CLOSE))


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    return json.dumps(text, ensure_ascii=False)
