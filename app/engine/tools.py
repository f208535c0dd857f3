"""The tool policy, enforced on what any backend produces.

Backends are asked to respect ``tool_choice`` (the embedded one constrains generation
with a grammar, upstreams get ``tool_choice``), but the guarantee is made here, the same
way for every backend:

* a call to a tool that was not offered, or that the policy does not allow
  (``tool_choice: none``, ``allowed_tools``), never reaches the client;
* a call whose arguments are not a JSON object never reaches the client, nor one of a
  ``strict`` tool (custom tools are offered strict) whose arguments do not match its
  schema: the embedded engine enforces a schema with a grammar only when a call is
  forced, and an upstream may not enforce it at all;
* ``parallel_tool_calls: false`` lets the first call through, ``max_tool_calls`` caps
  the number;
* ``tool_choice: required`` (or a named function) with no call left fails the response
  (``model_error``, code ``tool_call_missing``): the spec says the model MUST call. This
  holds only for a model that stopped on its own. A budget stop (``max_output_tokens``,
  finish ``length``; or ``content_filter``) is no failure: the response ends
  ``incomplete``, and a call cut short by it is released as written (its arguments may
  be unfinished JSON, or empty), so the builder closes it as the open item,
  ``incomplete``: the client sees what was cut, and an unfinished call is never marked
  completed.

Every suppressed call is logged with its reason. To be able to judge a call's arguments,
each call is held until it is complete (the next call starts, or the stream finishes),
then released as its name and whole arguments; text and reasoning stream untouched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from app.backends.base import Delta, Finish, GenerationRequest, ToolCallDelta, ToolPolicy
from app.errors import ModelError
from app.schemas import admitted, json_path

log = logging.getLogger("ors.tools")


@dataclass(slots=True)
class _PendingCall:
    name: str
    call_id: str | None
    pieces: list[str] = field(default_factory=list)


async def enforce_tool_policy(deltas: AsyncIterator[Delta], request: GenerationRequest) -> AsyncIterator[Delta]:
    """``deltas`` with the policy of ``request`` applied (see the module docstring).
    Closing this iterator closes ``deltas``."""
    policy = request.tool_policy
    offered = {tool.name for tool in request.tools}
    strict = {tool.name: tool.parameters for tool in request.tools if tool.strict and tool.parameters is not None}
    pending: _PendingCall | None = None
    pending_index = -1
    released = 0

    def release(cut_short: bool = False) -> list[Delta]:
        nonlocal pending, released
        call, pending = pending, None
        if call is None:
            return []
        arguments = "".join(call.pieces) or ("" if cut_short else "{}")
        reason = _rejection(call.name, arguments, offered, policy.may_call(call.name), released, policy, cut_short,
                            strict.get(call.name))
        if reason is not None:
            log.warning("suppressed a call to %r from model %s: %s", call.name, request.model, reason)
            return []
        released += 1
        return [ToolCallDelta(index=released - 1, name=call.name, arguments=arguments, call_id=call.call_id)]

    try:
        async for delta in deltas:
            if isinstance(delta, ToolCallDelta):
                if delta.index != pending_index or (delta.name and pending is None):
                    for ready in release():
                        yield ready
                    pending_index = delta.index
                    pending = _PendingCall(name=delta.name or "", call_id=delta.call_id)
                if pending is not None:
                    pending.pieces.append(delta.arguments)
                continue
            if isinstance(delta, Finish):
                budget_stop = delta.reason in _BUDGET_STOPS
                for ready in release(cut_short=budget_stop):
                    yield ready
                if policy.mode == "required" and request.tools and released == 0 and not budget_stop:
                    raise ModelError(
                        "The model did not call a tool, but tool_choice requires one.", code="tool_call_missing"
                    )
                if delta.reason == "tool_calls" and released == 0:
                    delta = Finish("stop", delta.usage)
                yield delta
                continue
            yield delta
    finally:
        await deltas.aclose()  # type: ignore[attr-defined]


_BUDGET_STOPS = frozenset({"length", "content_filter"})
"""Finish reasons that end a response ``incomplete``: generation was stopped, not done."""


def _rejection(
    name: str, arguments: str, offered: set[str], allowed: bool, released: int, policy: ToolPolicy,
    cut_short: bool = False, schema: dict[str, Any] | None = None,
) -> str | None:
    """Why a complete call must not reach the client, or ``None``. A call ``cut_short``
    by a budget stop is judged on everything but its (unfinished) arguments. ``schema``:
    the parameters of a ``strict`` tool (custom tools are strict), which the arguments
    must match."""
    if name not in offered:
        return "the tool was not offered in 'tools'"
    if not allowed:
        return "tool_choice does not allow this tool"
    if not policy.parallel and released >= 1:
        return "parallel_tool_calls is false and a call was already made"
    if policy.max_calls is not None and released >= policy.max_calls:
        return f"max_tool_calls ({policy.max_calls}) reached"
    if cut_short:
        return None
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        return f"its arguments are not valid JSON ({exc.msg})"
    if not isinstance(parsed, dict):
        return "its arguments are not a JSON object"
    compiled = admitted(schema) if schema is not None else None
    if compiled is not None and compiled.validator is not None:
        try:
            error = compiled.first_error(parsed)
        except RecursionError:
            return "its arguments nest too deeply to be checked against the strict tool's schema"
        if error is not None:
            return f"its arguments do not match the strict tool's schema at {json_path(error)}: {error.message}"
    return None
