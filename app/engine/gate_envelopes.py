"""Chat Completions shapes in a Responses request, which the replay gate refuses.

A client ported from Chat Completions may send its tool loop in that API's shapes: an
assistant message with ``tool_calls``, a ``role: "tool"`` (or ``"function"``) message, a
nested ``{"type": "function", "function": {...}}`` call. None of them is a Responses item;
:func:`chat_envelope` says which one an item is and what its Responses equivalent is, so
the refusal (``chat_completions_envelope``) tells the client how to fix the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.protocol.states import ItemType

_CALL_SHAPE = '{"type": "function_call", "call_id": <id>, "name": <function.name>, "arguments": <function.arguments>}'
_OUTPUT_SHAPE = '{"type": "function_call_output", "call_id": <tool_call_id>, "output": <content>}'


def chat_envelope(item: Mapping[str, Any]) -> str | None:
    """Why ``item`` is a Chat Completions shape, with its Responses equivalent, or ``None``."""
    kind = item.get("type")
    if kind in (None, ItemType.MESSAGE):
        role = item.get("role")
        if isinstance(item.get("tool_calls"), list):
            return (
                "This is a Chat Completions assistant message with tool_calls, which Responses does not "
                f"have. Send each tool call as its own function_call item after the message: {_CALL_SHAPE}."
            )
        if role in ("tool", "function"):
            return (
                f"A message with role {role!r} is a Chat Completions tool result. In Responses, a tool "
                f"result is a function_call_output item: {_OUTPUT_SHAPE}."
            )
    if kind in ("function", ItemType.FUNCTION_CALL) and isinstance(item.get("function"), Mapping):
        return (
            'This is a Chat Completions tool call ({"type": "function", "function": {...}}). In '
            f"Responses, a tool call is a flat function_call item: {_CALL_SHAPE}."
        )
    return None
