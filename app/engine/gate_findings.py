"""What the replay gate reports: its reasons, its findings, and how it names values.

A :class:`Finding` is the gate's verdict on one item or one tool; its ``reason`` is a
:class:`Reason`, which becomes the error ``code`` of a refused request and the word
``ors gate`` prints. A :class:`Problem` is a failure before it is attached to an item:
a sentence that follows a subject, so that the same check reads right whether it is
reported on a ``function_call`` itself or on the output that answers it. The checks and
their order are described in :mod:`app.engine.gate`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

CHAIN = "in the previous_response_id chain"
"""Where a call found in ``history`` is said to be."""

_MAX_SHOWN = 300


class Reason(StrEnum):
    """The finding codes; a failing request's error ``code`` is one of these."""

    OK = "ok"
    NOT_AN_ITEM = "not_an_item"
    CHAT_COMPLETIONS_ENVELOPE = "chat_completions_envelope"
    INVALID_TOOL_SCHEMA = "invalid_tool_schema"
    DUPLICATE_TOOL_NAME = "duplicate_tool_name"
    CALL_ID = "call_id"
    DUPLICATE_OUTPUT = "duplicate_output"
    NAMESPACED = "namespaced"
    NOT_FUNCTION_CALL = "not_function_call"
    STATUS = "status"
    ARGUMENTS_TYPE = "arguments_type"
    ARGUMENTS_PARSE = "arguments_parse"
    UNKNOWN_TOOL = "unknown_tool"
    ARGUMENTS_SCHEMA = "arguments_schema"


@dataclass(frozen=True, slots=True)
class Finding:
    """The verdict on one item (or one tool).

    ``index`` is the item's position in ``items`` (``None`` for a tool); ``param`` the
    path an error reports (``input[3]``, ``tools[0].parameters``); ``kind`` the item's
    ``type`` (``message`` for a typeless message, ``item`` for a non-object, ``tool``);
    ``reason`` a ``Reason``, ``ok`` when it passes; ``message`` says what is wrong and
    how to fix it (empty on a pass); ``call_id`` and ``name`` (the function, on calls
    and tools) when known. ``blocking`` is false for a failure that does not reject a
    request (a replayed ``function_call``'s own checks).
    """

    index: int | None
    param: str
    kind: str
    reason: str
    message: str = ""
    call_id: str | None = None
    name: str | None = None
    blocking: bool = True
    undefined_tool: bool = False
    """An ``unknown_tool`` failure of a well-formed call: the unknown-tool policy decides
    whether it blocks (see :mod:`app.engine.gate`)."""

    @property
    def ok(self) -> bool:
        return self.reason == Reason.OK


@dataclass(frozen=True, slots=True)
class Problem:
    """A failed check of a call, before it is reported on an item."""

    reason: Reason
    text: str
    """A sentence that follows the subject (``The function_call ... has status ...``)."""
    undefined_tool: bool = False
    """The call is well formed but names a tool nothing defines (see :mod:`app.engine.gate`)."""


def as_finding(
    index: int, param: str, kind: str, problem: Problem | None, subject: str,
    *, call_id: str | None, name: str | None = None, blocking: bool = True,
) -> Finding:
    """The finding on item ``index``: a pass when ``problem`` is ``None``, else ``subject``
    followed by the problem's sentence."""
    if problem is None:
        return Finding(index, param, kind, Reason.OK, call_id=call_id, name=name, blocking=blocking)
    return Finding(index, param, kind, problem.reason, f"{subject} {problem.text}", call_id, name, blocking,
                   problem.undefined_tool)


def kind_of(value: Any) -> str:
    """What a JSON value is, as a message says it (``a string``, ``null``, ``an array``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    return type(value).__name__


def show(value: Any) -> str:
    """``value`` quoted for a message (a string in quotes, anything else as JSON), clipped."""
    return clip(repr(value) if isinstance(value, str) else json.dumps(value, default=str))


def clip(text: str) -> str:
    """``text``, cut to a length a message can carry."""
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 1] + "…"
