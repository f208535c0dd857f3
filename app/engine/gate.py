"""The replay gate: every inbound ``function_call_output`` is checked against the call it answers.

A ``custom_tool_call_output`` (OpenAI's custom tools) is held to its ``custom_tool_call``
by the same rules: its ``input`` must be a string, and it is checked as the one-string
schema its tool was offered with (a ``regex`` format is that string's pattern).

A ``tool_search_output`` (OpenAI's tool search) answers the ``tool_search_call`` that
carries its ``call_id``, found, and refused as a duplicate, as any output is; a search has
no arguments to check. One that names no ``call_id`` passes only as a server-run search's
(``execution`` ``server`` or absent), which answers no call of the client's. The tools a
``tool_search_output`` of the request or its chain loaded are looked up, after the
request's and the chain's own, for a call nothing else defines.

A client that answers a tool call replays the conversation; the gate makes sure the call
being answered is one a model may be shown an answer to. It works on the request's items
exactly as sent (plain JSON values, never parsed models), so the same checks run on a
live request and, offline, on a logged item list (``ors gate``). Nothing here executes
anything: a pass means the shape is right, permissions stay with the client.

**Which call an output answers.** The nearest item before the output in ``items`` that
carries the same ``call_id`` (any item but an output), else the nearest such item of the
``previous_response_id`` chain (``history``). An output is a duplicate when that call
already has an output after it; a reused ``call_id`` thus starts afresh.

**Checks of an output, in precedence order** (the first that fails is the reason):

``call_id``            no item with that ``call_id`` precedes the output (or it has none)
``duplicate_output``   the call was already answered, earlier in ``items`` or in the chain
``namespaced``         the answered item's ``type`` is not a string or has a vendor prefix
``not_function_call``  the answered item is something else (a message, a reference...)
``status``             the call is not ``completed`` (absent counts as completed: the spec
                       makes it optional on input); ``in_progress``/``incomplete`` calls
                       may carry truncated arguments and must never be answered
``arguments_type``     the call's ``arguments`` is not a string
``arguments_parse``    ... is not valid JSON
``arguments_schema``   ... is not a JSON object (function arguments always are one)
``unknown_tool``       the call's ``name`` is defined neither in ``tools`` nor in
                       ``history_tools``: the chain's tools count for calls found in
                       ``items`` as well as for calls found in ``history``; a definition in
                       ``tools`` wins over the chain's, and the chain's latest wins. A call
                       with a ``namespace`` names a function of that ``namespace`` tool
                       (both are matched by the flat name ``namespace__name``)
``arguments_schema``   the arguments fail the tool's ``parameters`` (JSON Schema Draft
                       2020-12); no ``parameters`` means any object passes
``invalid_tool_schema`` the tool's ``parameters`` cannot be used to check: not admitted
                       by :mod:`app.schemas` (not a valid schema, a ``$ref`` outside the
                       document, a pattern RE2 cannot run, too large or too deep)

**A call of a tool nobody defined.** The spec asks only that an output answer a call in
the context; a client may replay a whole tool loop as history without sending its tools.
Such a call has no schema to hold its arguments to, so by default (``unknown_tool=
"accept"``) its ``unknown_tool`` finding does not block (``blocking`` is false) and the
server logs it; ``unknown_tool="reject"`` (``ORS_GATE_UNKNOWN_TOOL=reject``) refuses it.
Every structural check above it still blocks either way.

**Other findings.** ``not_an_item`` (an entry of ``input`` that is not a JSON object);
``chat_completions_envelope`` (a message with ``tool_calls``, a ``role: "tool"`` or
``"function"`` message, a nested ``{"type": "function", "function": {...}}`` call), whose
message names the Responses equivalent; ``invalid_tool_schema`` on a tool of ``tools``
itself (param ``tools[i].parameters``, checked whether or not a call uses it);
``duplicate_tool_name`` on a tool whose name (a namespaced function's flat name, a
custom tool's name) another tool before it already has (param ``tools[i].name``). Each
``function_call`` in ``items`` also gets a finding from the call checks (``status`` to
``arguments_schema``); it is informative only (``blocking`` is false): an unanswered
replayed call is context, and an answered one is judged through its output.

Findings come in order: the tools', then one per checked item in document order. The
work is linear in the number of items; compiled validators are cached by schema.

**The parts.** This module walks the items and finds the call each output answers;
:mod:`~app.engine.gate_tools` holds the tools by the name a call uses (and checks the
request's own), :mod:`~app.engine.gate_calls` checks one call against its tool,
:mod:`~app.engine.gate_envelopes` recognises Chat Completions shapes, and
:mod:`~app.engine.gate_findings` holds the reasons and findings all of them report
(which ``ors gate`` prints).
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from app.engine.gate_calls import call_problem
from app.engine.gate_envelopes import chat_envelope
from app.engine.gate_findings import CHAIN, Finding, Problem, Reason, as_finding, kind_of, show
from app.engine.gate_tools import Toolbox
from app.errors import InvalidRequest
from app.protocol.states import ItemType
from app.schemas import SchemaLimits

__all__ = ["OUTPUTS", "Finding", "Reason", "UnknownToolPolicy", "check_items", "gate", "is_namespaced"]

JSON = Mapping[str, Any]
UnknownToolPolicy = Literal["accept", "reject"]

log = logging.getLogger("ors.gate")

OUTPUTS: dict[str, ItemType] = {
    ItemType.FUNCTION_CALL_OUTPUT: ItemType.FUNCTION_CALL,
    ItemType.CUSTOM_TOOL_CALL_OUTPUT: ItemType.CUSTOM_TOOL_CALL,
    ItemType.TOOL_SEARCH_OUTPUT: ItemType.TOOL_SEARCH_CALL,
}
"""Each kind of output item, and the kind of call it answers."""


def is_namespaced(item: object) -> bool:
    """Whether ``item`` is a vendor extension item: its ``type`` carries a ``slug:`` prefix."""
    if not isinstance(item, Mapping):
        return False
    kind = item.get("type")
    return isinstance(kind, str) and ":" in kind


def gate(
    items: Sequence[Any] | str | None,
    *,
    history: Iterable[JSON] = (),
    tools: Iterable[Any] = (),
    history_tools: Iterable[Any] = (),
    unknown_tool: UnknownToolPolicy = "accept",
    schema_limits: SchemaLimits = SchemaLimits(),
) -> None:
    """Raise ``InvalidRequest`` (``code`` = the reason, ``param`` = the path) for the first
    blocking failure of ``check_items``; return when the request may go on. An accepted
    output that answers a call of an undefined tool is logged."""
    findings = check_items(items, history=history, tools=tools, history_tools=history_tools,
                           unknown_tool=unknown_tool, schema_limits=schema_limits)
    for finding in findings:
        if not finding.ok and finding.blocking:
            raise InvalidRequest(finding.message, code=str(finding.reason), param=finding.param)
    for finding in findings:
        if finding.reason == Reason.UNKNOWN_TOOL and isinstance(finding.kind, str) and finding.kind in OUTPUTS:
            log.info("replay gate accepted %s (%s): %s", finding.param, finding.reason, finding.message)


def check_items(
    items: Sequence[Any] | str | None,
    *,
    history: Iterable[JSON] = (),
    tools: Iterable[Any] = (),
    history_tools: Iterable[Any] = (),
    paths: Sequence[str] | None = None,
    unknown_tool: UnknownToolPolicy = "accept",
    schema_limits: SchemaLimits = SchemaLimits(),
) -> list[Finding]:
    """Every finding, passes included, for the request's ``input`` (``items``, as sent; a
    string or ``None`` has no items to check) and for the schemas of its ``tools``. ``history``: the chain's
    items, oldest first.
    ``tools``: this request's tool definitions; ``history_tools``: those the chain's
    responses offered, oldest first. ``paths`` names each item (default ``input[i]``).
    ``unknown_tool``: whether an output answering a call of an undefined tool blocks.
    ``schema_limits``: the size and depth a tool's ``parameters`` may have
    (:mod:`app.schemas` compiles them)."""
    if not isinstance(items, list | tuple):  # a string, or not items at all: validation says why
        return list(Toolbox(tools, history_tools, schema_limits).findings)
    items = list(items)
    toolbox = Toolbox(tools, history_tools, schema_limits, loaded=functools.partial(_loaded, history, items))
    names = list(paths) if paths is not None else [f"input[{index}]" for index in range(len(items))]
    walk = _Walk(items, names, history, toolbox, block_unknown_tool=unknown_tool == "reject")
    return [*toolbox.findings, *walk.findings()]


# ---------------------------------------------------------------- the walk


@dataclass(frozen=True, slots=True)
class _Located:
    item: JSON
    where: str


class _Walk:
    """One pass over ``items``, indexing calls by ``call_id`` as it goes."""

    def __init__(
        self, items: list[Any], paths: list[str], history: Iterable[JSON], toolbox: Toolbox,
        *, block_unknown_tool: bool,
    ) -> None:
        self.items = items
        self.paths = paths
        self.toolbox = toolbox
        self.block_unknown_tool = block_unknown_tool
        self._history = history
        self._chain: tuple[dict[str, JSON], set[str]] | None = None
        self.later_calls: dict[str, int] = {}
        for index, item in enumerate(items):
            call_id = _call_id(item)
            if call_id is not None and not _is_output(item):
                self.later_calls.setdefault(call_id, index)
        self.seen_calls: dict[str, int] = {}
        self.answered: dict[str, int] = {}
        self.call_problems: dict[int, Problem | None] = {}

    @property
    def chain_calls(self) -> dict[str, JSON]:
        return self._chain_index()[0]

    @property
    def chain_answered(self) -> set[str]:
        return self._chain_index()[1]

    def _chain_index(self) -> tuple[dict[str, JSON], set[str]]:
        """The chain's calls by ``call_id`` and the ids answered in it, indexed when an
        output first needs them: a turn that answers nothing never walks its history."""
        if self._chain is None:
            calls: dict[str, JSON] = {}
            answered: set[str] = set()
            for item in self._history:
                call_id = _call_id(item)
                if call_id is None:
                    continue
                if _is_output(item):
                    answered.add(call_id)
                else:
                    calls[call_id] = item
                    answered.discard(call_id)
            self._chain = calls, answered
        return self._chain

    def findings(self) -> list[Finding]:
        found: list[Finding] = []
        for index, item in enumerate(self.items):
            finding = self.check(index, item)
            if finding is not None:
                found.append(finding)
            call_id = _call_id(item)
            if call_id is None:
                continue
            if not _is_output(item):
                self.seen_calls[call_id] = index
                self.answered.pop(call_id, None)
        return found

    def check(self, index: int, item: Any) -> Finding | None:
        param = self.paths[index]
        if not isinstance(item, Mapping):
            return Finding(
                index, param, "item", Reason.NOT_AN_ITEM,
                f"This input entry is {kind_of(item)}, not an item. Each item is a JSON object with a "
                'type, e.g. {"type": "message", "role": "user", "content": "Hello"}.',
            )
        envelope = chat_envelope(item)
        if envelope is not None:
            return Finding(index, param, _item_kind(item), Reason.CHAT_COMPLETIONS_ENVELOPE, envelope)
        kind = item.get("type")
        if not isinstance(kind, str):
            return None
        if kind == ItemType.TOOL_SEARCH_OUTPUT and _call_id(item) is None and item.get("execution") != "client":
            return None  # a server-run search's output: it answers no call of the client's
        if kind in OUTPUTS:
            return self.check_output(index, param, item, kind)
        if kind in OUTPUTS.values() and kind != ItemType.TOOL_SEARCH_CALL:
            problem = self.call_problem(item)
            return as_finding(
                index, param, kind, problem, f"This {kind}",
                call_id=_call_id(item), name=_text_or_none(item.get("name")), blocking=False,
            )
        return None

    def check_output(self, index: int, param: str, item: JSON, output: str) -> Finding:
        call = OUTPUTS[output]

        def failure(index: int, param: str, reason: Reason, message: str, call_id: str | None = None) -> Finding:
            return Finding(index, param, output, reason, message, call_id)

        call_id = _call_id(item)
        if call_id is None:
            value = item.get("call_id")
            what = "has no call_id" if value is None else f"has a call_id that is {kind_of(value)}"
            return failure(
                index, param, Reason.CALL_ID,
                f"This {output} {what}. Set call_id to the call_id of the {call} it answers.",
            )
        called = self.find_call(call_id)
        if called is None:
            later = self.later_calls.get(call_id)
            if later is not None and later > index:
                text = (
                    f"The item with call_id {call_id!r} comes after this output, at {self.paths[later]}. "
                    f"Put each {output} after the {call} it answers."
                )
            else:
                text = (
                    f"No {call} with call_id {call_id!r} precedes this output, in input or "
                    f"{CHAIN}. Send the {call} before its output, or continue from the response "
                    "that made the call with previous_response_id."
                )
            return failure(index, param, Reason.CALL_ID, text, call_id)
        first = self.answered.setdefault(call_id, index)
        if first != index:
            return failure(
                index, param, Reason.DUPLICATE_OUTPUT,
                f"The call {call_id!r} is already answered at {self.paths[first]}; "
                "each call takes exactly one output. Remove the duplicate.",
                call_id,
            )
        if called.where == CHAIN and call_id in self.chain_answered:
            return failure(
                index, param, Reason.DUPLICATE_OUTPUT,
                f"The call {call_id!r} was already answered {CHAIN}; each call takes exactly one "
                "output. Remove this one.",
                call_id,
            )
        subject = f"The {call} this output answers (call_id {call_id!r}, {called.where})"
        kind = called.item.get("type")
        if kind is not None and (not isinstance(kind, str) or ":" in kind):
            return failure(
                index, param, Reason.NAMESPACED,
                f"The item with call_id {call_id!r} ({called.where}) has type {show(kind)}: a vendor "
                f"extension, not a portable {call}, and a {output} answers only a "
                f"{call}. Remove this output, or answer the call in its vendor's own format.",
                call_id,
            )
        if kind != call:
            shown = "no type" if kind is None else f"type {show(kind)}"
            return failure(
                index, param, Reason.NOT_FUNCTION_CALL,
                f"The item with call_id {call_id!r} ({called.where}) has {shown}, not a {call}; "
                f"a {output} answers only a {call}. Set call_id to the call_id of the "
                f"{call} this output answers.",
                call_id,
            )
        if call == ItemType.TOOL_SEARCH_CALL:
            return as_finding(index, param, output, None, subject, call_id=call_id)
        problem = self.call_problem(called.item)
        blocking = problem is None or not problem.undefined_tool or self.block_unknown_tool
        return as_finding(index, param, output, problem, subject, call_id=call_id, blocking=blocking)

    def find_call(self, call_id: str) -> _Located | None:
        if call_id in self.seen_calls:
            position = self.seen_calls[call_id]
            return _Located(self.items[position], self.paths[position])
        if call_id in self.chain_calls:
            return _Located(self.chain_calls[call_id], CHAIN)
        return None

    def call_problem(self, call: JSON) -> Problem | None:
        key = id(call)
        if key not in self.call_problems:
            self.call_problems[key] = call_problem(call, self.toolbox)
        return self.call_problems[key]


# ---------------------------------------------------------------- small helpers


def _call_id(item: Any) -> str | None:
    if not isinstance(item, Mapping):
        return None
    value = item.get("call_id")
    return value if isinstance(value, str) and value else None


def _item_kind(item: JSON) -> str:
    kind = item.get("type")
    if isinstance(kind, str):
        return kind
    return ItemType.MESSAGE if kind is None and "role" in item else "item"


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _loaded(history: Iterable[JSON], items: list[Any]) -> Iterable[Any]:
    """The tools the ``tool_search_output`` items of the chain and the request loaded."""
    for item in itertools.chain(history, items):
        if isinstance(item, Mapping) and item.get("type") == ItemType.TOOL_SEARCH_OUTPUT:
            tools = item.get("tools")
            if isinstance(tools, list):
                yield from tools


def _is_output(item: Mapping[str, Any]) -> bool:
    kind = item.get("type")
    return isinstance(kind, str) and kind in OUTPUTS
