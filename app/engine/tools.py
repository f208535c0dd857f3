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

Tool search (:mod:`app.engine.tool_search`): the functions a search loads become callable
when its ``ToolSearchOutputDelta`` passes (a server-run search's), and a call of a
client-run search's function (``tool_search``) passes as a ``ToolSearchCallDelta`` for the
client to answer, counted as a call.

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

from app.backends.base import (
    Delta,
    Finish,
    GenerationRequest,
    McpApprovalRequestDelta,
    McpCallDelta,
    ToolCallDelta,
    ToolPolicy,
    ToolSearchCallDelta,
    ToolSearchOutputDelta,
)
from app.engine.tool_search import SEARCH_FUNCTION, ToolSurface
from app.errors import ModelError
from app.schemas import admitted, json_path

log = logging.getLogger("ors.tools")


@dataclass(slots=True)
class _PendingCall:
    name: str
    call_id: str | None
    pieces: list[str] = field(default_factory=list)


class ToolCallGuard:
    """The policy of one request, applied to its deltas one at a time (see the module
    docstring): :meth:`feed` says what may pass in a delta's place. A plain object the
    run's pump calls in its own loop, so a delta crosses no generator of its own."""

    __slots__ = ("request", "policy", "offered", "strict", "pending", "pending_index", "released", "surface",
                 "client_search", "served")

    def __init__(self, request: GenerationRequest, surface: ToolSurface | None = None) -> None:
        self.request = request
        self.policy = request.tool_policy
        tools = (*request.tools, *request.late_tools) if request.late_tools else request.tools
        self.offered = {tool.name for tool in tools}
        self.strict = {tool.name: tool.parameters for tool in tools if tool.strict and tool.parameters is not None}
        self.surface = surface
        """The request's tools, for what a tool search loads (``None`` without one)."""
        self.client_search = (surface is not None and surface.execution == "client" and surface.hosted is None
                              and SEARCH_FUNCTION in self.offered)
        """Calls of ``tool_search`` are a client-run search's."""
        self.pending: _PendingCall | None = None
        self.pending_index = -1
        self.released = 0
        self.served = False
        """Whether an MCP call was made or asked for (it satisfies a ``required`` choice)."""

    def feed(self, delta: Delta) -> Delta | list[Delta]:
        """``delta`` itself when it passes as it is (text, reasoning: most deltas), or
        the list of deltas that pass now in its place (calls released once whole; none
        while a call is held). At the ``Finish``, raises ``ModelError``
        (``tool_call_missing``) when a call was required and none was made."""
        if isinstance(delta, ToolCallDelta):
            ready: list[Delta] = []
            if delta.index != self.pending_index or (delta.name and self.pending is None):
                ready = self._release()
                self.pending_index = delta.index
                self.pending = _PendingCall(name=delta.name or "", call_id=delta.call_id)
            if self.pending is not None:
                self.pending.pieces.append(delta.arguments)
            return ready
        if isinstance(delta, ToolSearchCallDelta | ToolSearchOutputDelta):
            ready = self._release()
            if isinstance(delta, ToolSearchOutputDelta):
                self._load(delta.names)
            elif delta.execution == "client":
                self.released += 1
            ready.append(delta)
            return ready
        if isinstance(delta, McpCallDelta | McpApprovalRequestDelta):  # a call made or asked for by the server
            ready = self._release()
            self.served = True
            ready.append(delta)
            return ready
        if isinstance(delta, Finish):
            budget_stop = delta.reason in BUDGET_STOPS
            ready = self._release(cut_short=budget_stop)
            if (self.policy.mode == "required" and self.request.tools and self.released == 0 and not self.served
                    and not budget_stop):
                raise ModelError("The model did not call a tool, but tool_choice requires one.",
                                 code="tool_call_missing")
            if delta.reason == "tool_calls" and self.released == 0:
                delta = Finish("stop", delta.usage)
            ready.append(delta)
            return ready
        return delta

    def _release(self, cut_short: bool = False) -> list[Delta]:
        call, self.pending = self.pending, None
        if call is None:
            return []
        arguments = "".join(call.pieces) or ("" if cut_short else "{}")
        reason = _rejection(call.name, arguments, self.offered, self.policy.may_call(call.name), self.released,
                            self.policy, cut_short, self.strict.get(call.name))
        if reason is not None:
            log.warning("suppressed a call to %r from model %s: %s", call.name, self.request.model, reason)
            return []
        self.released += 1
        if self.client_search and call.name == SEARCH_FUNCTION:
            return [ToolSearchCallDelta(call.call_id, _object(arguments), "client")]
        return [ToolCallDelta(index=self.released - 1, name=call.name, arguments=arguments, call_id=call.call_id)]

    def _load(self, names: tuple[str, ...]) -> None:
        """The functions a search loaded are callable from now on, strict ones held to
        their schema."""
        self.offered.update(names)
        offered = self.surface.offered if self.surface is not None else {}
        for name in names:
            function = offered.get(name)
            if function is not None and function.strict and function.parameters is not None:
                self.strict[name] = function.parameters


async def enforce_tool_policy(deltas: AsyncIterator[Delta], request: GenerationRequest,
                              surface: ToolSurface | None = None) -> AsyncIterator[Delta]:
    """``deltas`` with the policy of ``request`` applied, as a generator (for a consumer
    that needs one: a strict ``text.format`` check). Closing this iterator closes
    ``deltas``."""
    guard = ToolCallGuard(request, surface)
    try:
        async for delta in deltas:
            passed = guard.feed(delta)
            if passed is delta:
                yield delta
            else:
                for each in passed:  # type: ignore[union-attr]
                    yield each
    finally:
        await deltas.aclose()  # type: ignore[attr-defined]


def _object(arguments: str) -> dict[str, Any]:
    """A call's arguments as a JSON object (``{}`` for a call cut short before it was one)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


BUDGET_STOPS = frozenset({"length", "content_filter"})
"""Finish reasons that end a response ``incomplete``: generation was stopped, not done
(and a server-run loop runs none of the calls that round made: they may be cut)."""


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
