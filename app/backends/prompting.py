"""What a local model sees: the conversation rendered with the GGUF's own chat template.

The templates are Hugging Face style Jinja templates stored in the GGUF metadata. They
expect OpenAI-shaped chat messages, with some quirks that this module absorbs:

* ``content`` is always a plain string (Qwen's template fails on a list of parts, and
  SmolLM2's concatenates it, so ``None`` would fail too).
* ``developer`` becomes ``system``. Each system message stays a turn of its own:
  ``messages[0]`` is the template's system prompt (Qwen appends its tools there), and a
  later one is rendered where it stands, so that a conversation that grows by more system
  messages (an agent's permissions, its environment) extends the prompt of its first
  message and tools instead of rewriting it; the prompt cache, and a warm-up of the
  first request (:mod:`app.backends.warm_ups`), then hold. Only for a template that
  rejects a system message after the first are the leading ones merged into one.
* Assistant ``tool_calls`` carry ``arguments`` as a JSON object where possible: templates
  render them with ``tojson``, and a string would be rendered doubly quoted.

Tools are part of the prompt whatever the tool policy: every tool of the request is shown,
also under ``tool_choice: none`` or ``allowed_tools``, so the prompt (and the model's KV
cache) does not depend on the policy. What may be called is enforced on the output (see
``toolcalls``). A template with a tools section renders them itself; for one without, a
short description of the tools goes into the system message. When tools or tool results
are present, the system message also asks the model to answer from tool results (small
models otherwise tend to repeat the call).

The grammar that constrains the output is built by :mod:`app.backends.grammar`;
``output_grammar`` and ``JSON_CHAR_RULE`` are re-exported here (see ``__all__``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.backends.base import ChatMessage, ToolCall, ToolSpec
from app.backends.grammar import JSON_CHAR_RULE, output_grammar
from app.errors import InvalidRequest, ModelError

__all__ = [
    "DEFAULT_SYSTEM", "TOOL_RESULT_HINT", "ChatTemplate", "prompt_messages", "template_messages", "template_tools",
    "tool_instructions", "unicode_text",
    # the output's grammar, defined in grammar
    "JSON_CHAR_RULE", "output_grammar",
]


def template_messages(messages: Sequence[ChatMessage], *, merge_system: bool = False) -> list[dict[str, Any]]:
    """The conversation as the chat template expects it (OpenAI chat message dicts); with
    ``merge_system``, the leading system messages as one (see the module docstring)."""
    rendered: list[dict[str, Any]] = []
    for message in messages:
        role = "system" if message.role == "developer" else message.role
        if merge_system and role == "system" and rendered and _only_system_so_far(rendered):
            rendered[-1]["content"] = _join(rendered[-1]["content"], message.content)
            continue
        entry: dict[str, Any] = {"role": role, "content": message.content or ""}
        if role == "assistant" and message.tool_calls:
            entry["tool_calls"] = [_template_tool_call(call) for call in message.tool_calls]
        if role == "tool":
            entry["tool_call_id"] = message.tool_call_id or ""
        rendered.append(entry)
    return rendered


def template_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]] | None:
    """All tools of the request in the OpenAI ``tools`` shape; ``None`` when there are none.

    The policy plays no part: a tool the model may not call is still shown (see above).
    """
    if not tools:
        return None
    return [{"type": "function", "function": _tool_function(tool)} for tool in tools]


DEFAULT_SYSTEM = "You are a helpful assistant."
"""The system prompt of a conversation with tools that brings none of its own."""

TOOL_RESULT_HINT = (
    "When a tool result is available, use it to answer the user's question directly; "
    "do not repeat the call and do not explain how to call a tool."
)
"""Ends the system message of every conversation with tools or tool results."""


def tool_instructions(tools: Sequence[ToolSpec]) -> str:
    """The tools described in prose, for a chat template that cannot render them."""
    listing = "\n".join(_tojson(_tool_function(tool)) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query. "
        f"The functions:\n{listing}\n\nTo call a function, answer with only a JSON object: "
        '{"name": <function-name>, "arguments": <args-json-object>}'
    )


def prompt_messages(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, template_renders_tools: bool
) -> tuple[ChatMessage, ...]:
    """``messages`` with the system text that tool use needs at the end of the first
    system message (the template's system prompt; the tools follow it), so that the
    prompt of the conversation's start does not change when more system messages come.

    Depends only on the conversation and the tools, never on the tool policy. A
    conversation without tools or tool results is returned unchanged. Without a system
    message of its own it gets ``DEFAULT_SYSTEM`` (the template's own default is lost
    once any system message is present); then, for a template without a tools section,
    ``tool_instructions``; then ``TOOL_RESULT_HINT``.
    """
    if not tools and not any(message.role == "tool" for message in messages):
        return tuple(messages)
    first = messages[0] if messages and messages[0].role in ("system", "developer") else None
    parts = [first.content] if first is not None else [DEFAULT_SYSTEM]
    if tools and not template_renders_tools:
        parts.append(tool_instructions(tools))
    parts.append(TOOL_RESULT_HINT)
    system = ChatMessage("system", "\n\n".join(part for part in parts if part))
    return (system, *messages[1:]) if first is not None else (system, *messages)


class ChatTemplate:
    """A GGUF chat template, rendered as Hugging Face's ``apply_chat_template`` renders it."""

    def __init__(self, template: str, *, bos_token: str, eos_token: str) -> None:
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        environment.filters["tojson"] = _tojson
        environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        self._template = environment.from_string(template)
        self._special = {"bos_token": bos_token, "eos_token": eos_token}

    def render(self, messages: Sequence[ChatMessage], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text, ending with the assistant's generation prompt.

        A template that rejects the conversation (``raise_exception``) gives
        ``InvalidRequest``; any other template failure is a ``ModelError``.
        """
        try:
            try:
                return self._render(template_messages(messages), tools)
            except _ConversationRejected:
                merged = template_messages(messages, merge_system=True)
                if len(merged) == len(messages):
                    raise
                return self._render(merged, tools)
        except _ConversationRejected as exc:
            raise InvalidRequest(f"The model cannot take this conversation: {exc}", param="input") from exc
        except (TemplateError, TypeError, ValueError, KeyError) as exc:
            raise ModelError(f"The model's chat template failed to render: {exc}") from exc

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return self._template.render(messages=messages, tools=tools, add_generation_prompt=True, **self._special)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def unicode_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD: the tokenizer and llama.cpp's
    grammar parser take UTF-8, which cannot hold one. A request's own text has none
    (``engine.validation.decode_json`` replaces them); this guards what reaches a prompt
    from elsewhere, such as a conversation stored before that."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text)
    return text


class _ConversationRejected(Exception):
    pass


def _raise_exception(message: str) -> None:
    raise _ConversationRejected(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """The ``tojson`` filter as chat templates expect it (unlike Jinja's, it does not escape HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _only_system_so_far(rendered: list[dict[str, Any]]) -> bool:
    return len(rendered) == 1 and rendered[0]["role"] == "system"


def _join(first: str, second: str) -> str:
    return "\n\n".join(part for part in (first, second) if part)


def _tool_function(tool: ToolSpec) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description or "",
        "parameters": tool.parameters or {"type": "object", "properties": {}},
    }


def _template_tool_call(call: ToolCall) -> dict[str, Any]:
    try:
        arguments: Any = json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        arguments = call.arguments
    return {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }
