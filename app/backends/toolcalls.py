"""Tool calls on the embedded backend: the model's written calls parsed into
``ToolCallDelta``s.

The local models have no tool-call channel: a call is text the model writes
(:mod:`app.backends.call_syntax`). Three shapes are recognised, each holding one JSON
object ``{"name": ..., "arguments": {...}}``:

* ``<tool_call>{...}</tool_call>``: the tags of templates with a tools section (Qwen);
  anywhere in the answer, also after some prose;
* a fenced block: three backticks, an optional ``json`` (or ``tool_call``) label, the
  object, three backticks; only where a call may start (see below);
* a bare object, only where a call may start.

A call may start at the beginning of the answer and right after another call (whitespace
aside). The object's braces may be doubled (``{{...}}``), as Qwen's template shows them.

**What counts as a call.** The object must parse, have a string ``name`` that is one of
the request's tools, and nothing but ``arguments`` besides it; ``arguments`` must be a
JSON object (a JSON string holding one, or no ``arguments`` at all for ``{}``, are taken
too). It is emitted as one ``ToolCallDelta`` with ``arguments`` re-serialised compactly
(``json.dumps``), once the whole block has been read. Anything else is text, emitted
exactly as written: an unknown name, broken JSON, a fenced block of code.

**What is suppressed, and why.** ``allowed_tools`` is a hard limit that the prompt
cannot express (every tool stays visible so that the prompt never depends on the policy).
A well-formed call to a tool of the request that the policy does not allow is therefore
dropped and logged, never shown as text: the client asked for it not to happen, and the
call's JSON is no answer. Calls beyond ``parallel_tool_calls: false`` (one) or
``max_tool_calls`` are dropped and logged the same way. What the model wrote around a
dropped call remains the answer; if that is nothing, the answer is empty. Whitespace
between a kept call and the text around it is left out; of the whitespace around a
dropped call, only what came before it is kept.

**When a call is required** the forcing grammar (:mod:`app.backends.grammar`) lets the
model write calls only, so any text the parser is left with at the end is a call cut
short (by ``max_output_tokens``). Once its name is written it is emitted as that call
with its arguments as far as they got (possibly unfinished JSON): the engine then closes
it ``incomplete`` with the response (``app.engine.tools``). Anything shorter is dropped
and logged, not shown.

**When nothing can be called** (``tool_choice: none``, no tools, or structured output
forced by ``text.format`` while no call is required) the parser passes all text through.

**Streaming hold-back.** Prose streams as it arrives. Held back are: text from a ``<``
for as long as it may still become ``<tool_call>``, and then the whole tag block until
it closes; where a call may start, also a backtick fence (until its label shows it is
not JSON, or its block ends) and a ``{`` (until the object ends, or its first character
shows it is no call object); and trailing whitespace, until it is known not to precede
a call. At the end of generation a block whose object is complete but whose closing tag
or fence is missing still counts as a call; any other held text is released as text.

The call syntax and the forcing grammar are re-exported here (see ``__all__``): the
embedded backend takes every name of its tool calls from this module.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from app.backends.base import Delta, GenerationRequest, TextDelta, ToolCallDelta, ToolPolicy
from app.backends.call_syntax import FENCE, FENCE_LABELS, TAG_CLOSE, TAG_OPEN, CallShape, call_shape
from app.backends.grammar import MAX_FORCED_CALLS, tool_call_grammar
from app.backends.model_files import ModelSpec

__all__ = [
    # the parser, this module's own
    "ToolCallParser", "tool_call_parser",
    # how calls are written and forced, defined in call_syntax and grammar
    "FENCE", "FENCE_LABELS", "MAX_FORCED_CALLS", "TAG_CLOSE", "TAG_OPEN", "CallShape", "call_shape",
    "tool_call_grammar",
]

log = logging.getLogger("ors.tools")

_WAIT = object()
_LABEL_CHARS = re.compile(r"[A-Za-z_]*")
_CUT_CALL_HEAD = re.compile(r'\s*(?:<tool_call>\s*)?(?P<object>\{)\s*"name"\s*:\s*"(?P<name>[^"\\]*)"')
_ARGUMENTS_KEY = re.compile(r'\s*,\s*"arguments"\s*:\s*')


@dataclass(frozen=True, slots=True)
class _Block:
    end: int
    """Where the block ends in the buffer."""
    body: str
    """The JSON object's text."""


class ToolCallParser:
    """The ``OutputParser`` of generations that may call tools; see the module docstring."""

    def __init__(self, tools: Collection[str], policy: ToolPolicy, *, passthrough: bool = False) -> None:
        self._offered = frozenset(tools)
        self._policy = policy
        self._passthrough = passthrough or policy.mode == "none" or not self._offered
        self._forced = policy.mode == "required" and not self._passthrough
        limits = [limit for limit in (None if policy.parallel else 1, policy.max_calls) if limit is not None]
        self._limit = min(limits) if limits else None
        self._buffer = ""
        self._call_may_start = True
        self._after_call = False
        self._calls = 0

    def feed(self, text: str) -> list[Delta]:
        if self._passthrough:
            return [TextDelta(text)] if text else []
        self._buffer += text
        return self._advance(final=False)

    def close(self) -> list[Delta]:
        if self._passthrough:
            return []
        if self._forced and (cut := self._cut_call()) is not None:
            return cut
        return self._advance(final=True)

    def _cut_call(self) -> list[Delta] | None:
        """A forced call that generation stopped in the middle of, as a call with the
        arguments written so far; ``None`` when the buffer holds no such call."""
        head = _CUT_CALL_HEAD.match(self._buffer)
        if head is None or _object_end(self._buffer, head.start("object")) is not None:
            return None
        name = head.group("name")
        if name not in self._offered or self._refusal(name) is not None:
            return None
        rest = self._buffer[head.end() :]
        separator = _ARGUMENTS_KEY.match(rest)
        arguments = rest[separator.end() :] if separator else ""
        self._buffer = ""
        out: list[Delta] = [ToolCallDelta(index=self._calls, name=name, arguments=arguments)]
        self._calls += 1
        return out

    def _advance(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while self._buffer:
            step = self._at_call_start if self._call_may_start else self._in_prose
            if not step(final, out):
                break
        return _merged(out)

    def _at_call_start(self, final: bool, out: list[Delta]) -> bool:
        """Where a call may start: decide what the first visible character begins."""
        text = self._buffer
        start = len(text) - len(text.lstrip())
        if start == len(text):
            if not final:
                return False
            self._emit(text, out)
            self._buffer = ""
            return True
        match = {"<": _match_tag, "`": _match_fence, "{": _match_bare}.get(text[start])
        block = match(text, start, final) if match else None
        if block is _WAIT:
            return False
        if isinstance(block, _Block) and self._take(block.body, text[:start], out):
            self._buffer = text[block.end :]
            return True
        self._call_may_start = False
        if isinstance(block, _Block):
            self._emit(text[: block.end], out)
            self._buffer = text[block.end :]
        return True

    def _in_prose(self, final: bool, out: list[Delta]) -> bool:
        """Inside text: stream it, holding back only what may begin a tagged call."""
        text = self._buffer
        at = text.find("<")
        if at < 0:
            keep = 0 if final else len(text) - len(text.rstrip())
            self._emit(text[: len(text) - keep], out)
            self._buffer = text[len(text) - keep :]
            return False
        block = _match_tag(text, at, final)
        if block is None:
            self._emit(text[: at + 1], out)
            self._buffer = text[at + 1 :]
            return True
        prose = text[:at].rstrip()
        if block is _WAIT:
            self._emit(prose, out)
            self._buffer = text[len(prose) :]
            return False
        assert isinstance(block, _Block)
        if self._take(block.body, text[:at], out):
            self._buffer = text[block.end :]
            self._call_may_start = True
        else:
            self._emit(text[: block.end], out)
            self._buffer = text[block.end :]
        return True

    def _take(self, body: str, before: str, out: list[Delta]) -> bool:
        """If ``body`` is a call object: emit ``before`` and the call (or drop it), and say so.

        Whitespace that separates a kept call from the text before it is left out; a
        dropped call leaves that whitespace in place of itself.
        """
        call = _call_object(body, self._offered)
        if call is None:
            return False
        name, arguments = call
        reason = self._refusal(name)
        if reason is None:
            self._emit(before.rstrip(), out)
            out.append(ToolCallDelta(index=self._calls, name=name, arguments=arguments))
            self._calls += 1
        else:
            self._emit(before, out)
            log.warning("dropped the model's call to %r: %s", name, reason)
        self._after_call = True
        return True

    def _refusal(self, name: str) -> str | None:
        if not self._policy.may_call(name):
            return "tool_choice does not allow this tool"
        if self._limit is not None and self._calls >= self._limit:
            if not self._policy.parallel:
                return "parallel_tool_calls is false and a call was already made"
            return f"max_tool_calls ({self._policy.max_calls}) reached"
        return None

    def _emit(self, text: str, out: list[Delta]) -> None:
        if self._after_call:
            text = text.lstrip()
        if text and self._forced:
            log.warning("dropped %d characters of an unfinished call", len(text))
            return
        if text:
            out.append(TextDelta(text))
            self._after_call = False


def tool_call_parser(request: GenerationRequest, spec: ModelSpec | None = None) -> ToolCallParser:
    """The parser for one generation (an ``OutputParserFactory``)."""
    structured = request.output_format.kind != "text" and request.tool_policy.mode != "required"
    names = [tool.name for tool in (*request.tools, *request.late_tools)]
    return ToolCallParser(names, request.tool_policy, passthrough=structured)


def _match_tag(text: str, start: int, final: bool) -> _Block | object | None:
    return _match_block(text, start, final, TAG_OPEN, TAG_CLOSE)


def _match_fence(text: str, start: int, final: bool) -> _Block | object | None:
    if not FENCE.startswith(text[start : start + len(FENCE)]):
        return None
    if len(text) - start < len(FENCE):
        return None if final else _WAIT
    label_start = start + len(FENCE)
    label = _LABEL_CHARS.match(text, label_start)
    assert label is not None
    if label.end() == len(text):
        viable = any(option.startswith(label.group().lower()) for option in FENCE_LABELS)
        return _WAIT if viable and not final else None
    if label.group().lower() not in FENCE_LABELS:
        return None
    return _match_block(text, start, final, text[start : label.end()], FENCE)


def _match_bare(text: str, start: int, final: bool) -> _Block | object | None:
    return _match_block(text, start, final, "", "")


def _match_block(text: str, start: int, final: bool, opener: str, closer: str) -> _Block | object | None:
    """The block ``opener`` object ``closer`` (whitespace between) at ``start``; ``_WAIT``
    while the text so far may still become one, ``None`` once it cannot."""
    head = text[start : start + len(opener)]
    if head != opener:
        return _WAIT if opener.startswith(head) and not final else None
    at = _skip_space(text, start + len(opener))
    if at == len(text):
        return None if final else _WAIT
    if text[at] != "{":
        return None
    end = _object_end(text, at)
    if end is None:
        return None if final else _WAIT
    if end < 0:
        return None
    if not closer:
        return _Block(end, text[at:end])
    after = _skip_space(text, end)
    tail = text[after : after + len(closer)]
    if tail == closer:
        return _Block(after + len(closer), text[at:end])
    if not closer.startswith(tail):
        return None
    if final:
        return _Block(len(text), text[at:end])
    return _WAIT


def _object_end(text: str, start: int) -> int | None:
    """The end of the JSON object at ``start`` (brackets balanced), ``None`` if it has not
    ended yet, ``-1`` if it cannot be a call object (no key or inner brace comes first)."""
    first = _skip_space(text, start + 1)
    if first < len(text) and text[first] not in "\"{":
        return -1
    depth, in_string, escaped = 0, False, False
    for at in range(start, len(text)):
        char = text[at]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return at + 1
    return None


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _call_object(body: str, offered: Collection[str]) -> tuple[str, str] | None:
    """``(name, compact arguments)`` if ``body`` is a call to an offered tool."""
    value = _loads(body)
    if value is None and body.startswith("{{") and body.endswith("}}"):
        value = _loads(body[1:-1])
    if not isinstance(value, dict) or not set(value) <= {"name", "arguments"}:
        return None
    name, arguments = value.get("name"), value.get("arguments", {})
    if isinstance(arguments, str):
        arguments = _loads(arguments)
    if not isinstance(name, str) or name not in offered or not isinstance(arguments, dict):
        return None
    return name, json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str) -> Any:
    """The JSON value of ``text`` (raw control characters in strings allowed), or ``None``."""
    try:
        return json.loads(text, strict=False)
    except ValueError:
        return None


def _merged(deltas: list[Delta]) -> list[Delta]:
    merged: list[Delta] = []
    for delta in deltas:
        if isinstance(delta, TextDelta) and merged and isinstance(merged[-1], TextDelta):
            merged[-1] = TextDelta(merged[-1].text + delta.text)
        else:
            merged.append(delta)
    return merged
