"""The replay gate: every inbound ``function_call_output`` is checked against the call it answers.

A ``custom_tool_call_output`` (OpenAI's custom tools) is held to its ``custom_tool_call``
by the same rules: its ``input`` must be a string, and it is checked as the one-string
schema its tool was offered with (a ``regex`` format is that string's pattern).

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
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from referencing.exceptions import Unresolvable

from app.errors import InvalidRequest
from app.protocol.tools import CUSTOM_INPUT, custom_parameters, qualified_name
from app.schemas import SchemaLimits, compile_schema

JSON = Mapping[str, Any]
UnknownToolPolicy = Literal["accept", "reject"]

log = logging.getLogger("ors.gate")

OUTPUTS = {"function_call_output": "function_call", "custom_tool_call_output": "custom_tool_call"}
"""Each kind of output item, and the kind of call it answers."""


def _is_output(item: Mapping[str, Any]) -> bool:
    kind = item.get("type")
    return isinstance(kind, str) and kind in OUTPUTS

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
    whether it blocks (see the module docstring)."""

    @property
    def ok(self) -> bool:
        return self.reason == Reason.OK


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
    toolbox = _Toolbox(tools, history_tools, schema_limits)
    if not isinstance(items, list | tuple):  # a string, or not items at all: validation says why
        return list(toolbox.findings)
    items = list(items)
    names = list(paths) if paths is not None else [f"input[{index}]" for index in range(len(items))]
    walk = _Walk(items, names, history, toolbox, block_unknown_tool=unknown_tool == "reject")
    return [*toolbox.findings, *walk.findings()]


# ---------------------------------------------------------------- tools and schemas


@dataclass(frozen=True, slots=True)
class _Tool:
    name: str
    parameters: Any
    param: str | None
    """``tools[i].parameters`` for a tool of this request, ``None`` for one of the chain."""


class _Toolbox:
    def __init__(self, tools: Iterable[Any], history_tools: Iterable[Any], limits: SchemaLimits) -> None:
        self.limits = limits
        self.by_name: dict[str, _Tool] = {}
        for tool, _ in _functions(history_tools, "tools"):
            if (name := _function_name(tool)) is not None:
                self.by_name[name] = _Tool(name, tool.get("parameters"), None)
        self.findings: list[Finding] = []
        own: dict[str, _Tool] = {}
        first_at: dict[str, str] = {}
        for tool, path in _functions(tools, "tools"):
            name = _function_name(tool)
            if name is None:
                continue
            if name in own:  # a call by this name could mean either: refused, not guessed
                self.findings.append(Finding(
                    None, f"{path}.name", "tool", Reason.DUPLICATE_TOOL_NAME,
                    f"Tool names must be unique: {name!r} is also the name of {first_at[name]}. "
                    "Rename or remove one of them.", name=name))
                continue
            first_at[name] = path
            custom = tool.get("type") == "custom"
            param = f"{path}.format.definition" if custom else f"{path}.parameters"
            own[name] = _Tool(name, tool.get("parameters"), param)
            problem = self.schema_error(own[name], self.limits)
            if problem is not None:
                what = (f"The regex format of custom tool {name!r} cannot be used" if custom
                        else f"The parameters of function {name!r} cannot be used as a JSON Schema (Draft 2020-12)")
                self.findings.append(
                    Finding(None, param, "tool", Reason.INVALID_TOOL_SCHEMA, f"{what}: {problem}. Fix it.", name=name)
                )
        self.by_name.update(own)

    @staticmethod
    def schema_error(tool: _Tool, limits: SchemaLimits) -> str | None:
        if tool.parameters is None:
            return None
        return compile_schema(tool.parameters, limits).problem


def _functions(tools: Iterable[Any], path: str) -> Iterable[tuple[Any, str]]:
    """Each entry of ``tools`` with its path, a ``namespace`` tool's functions in its
    place, each carrying the namespace (as an echoed namespaced function does), and a
    ``custom`` tool as the function of one string a model is offered (its ``regex``
    format the string's pattern; a ``lark`` one is not offered, so not here either)."""
    for index, tool in enumerate(tools):
        if isinstance(tool, Mapping) and tool.get("type") == "custom":
            fmt = tool.get("format")
            fmt = fmt if isinstance(fmt, Mapping) else {}
            if fmt.get("type") == "grammar" and fmt.get("syntax") == "lark":
                continue
            regex = fmt.get("definition") if fmt.get("type") == "grammar" else None
            yield ({"type": "custom", "name": tool.get("name"),
                    "parameters": custom_parameters(regex if isinstance(regex, str) else None)}, f"{path}[{index}]")
            continue
        if isinstance(tool, Mapping) and tool.get("type") == "namespace":
            group, inner = tool.get("name"), tool.get("tools")
            if isinstance(group, str) and isinstance(inner, list):
                for position, function in enumerate(inner):
                    if isinstance(function, Mapping):
                        yield {**function, "namespace": group}, f"{path}[{index}].tools[{position}]"
            continue
        yield tool, f"{path}[{index}]"


def _function_name(tool: Any) -> str | None:
    """The name a function tool is called by: its flat name when it has a namespace."""
    if not isinstance(tool, Mapping) or tool.get("type", "function") not in ("function", "custom"):
        return None
    return _called_name(tool)


def _called_name(item: Mapping[str, Any]) -> str | None:
    """``name``, qualified by ``namespace`` when the tool or call carries one."""
    name, namespace = item.get("name"), item.get("namespace")
    if not isinstance(name, str):
        return None
    return qualified_name(namespace, name) if isinstance(namespace, str) else name


# ---------------------------------------------------------------- the walk


@dataclass(frozen=True, slots=True)
class _Problem:
    reason: Reason
    text: str
    """A sentence that follows the subject (``The function_call ... has status ...``)."""
    undefined_tool: bool = False
    """The call is well formed but names a tool nothing defines (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class _Located:
    item: JSON
    where: str


class _Walk:
    """One pass over ``items``, indexing calls by ``call_id`` as it goes."""

    def __init__(
        self, items: list[Any], paths: list[str], history: Iterable[JSON], toolbox: _Toolbox,
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
        self.call_problems: dict[int, _Problem | None] = {}

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
                f"This input entry is {_kind_of(item)}, not an item. Each item is a JSON object with a "
                'type, e.g. {"type": "message", "role": "user", "content": "Hello"}.',
            )
        envelope = _chat_envelope(item)
        if envelope is not None:
            return Finding(index, param, _item_kind(item), Reason.CHAT_COMPLETIONS_ENVELOPE, envelope)
        kind = item.get("type")
        if _is_output(item):
            return self.check_output(index, param, item, kind)
        if isinstance(kind, str) and kind in ("function_call", "custom_tool_call"):
            problem = self.call_problem(item)
            return _finding(
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
            what = "has no call_id" if value is None else f"has a call_id that is {_kind_of(value)}"
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
                f"The item with call_id {call_id!r} ({called.where}) has type {_show(kind)}: a vendor "
                f"extension, not a portable {call}, and a {output} answers only a "
                f"{call}. Remove this output, or answer the call in its vendor's own format.",
                call_id,
            )
        if kind != call:
            shown = "no type" if kind is None else f"type {_show(kind)}"
            return failure(
                index, param, Reason.NOT_FUNCTION_CALL,
                f"The item with call_id {call_id!r} ({called.where}) has {shown}, not a {call}; "
                f"a {output} answers only a {call}. Set call_id to the call_id of the "
                f"{call} this output answers.",
                call_id,
            )
        problem = self.call_problem(called.item)
        blocking = problem is None or not problem.undefined_tool or self.block_unknown_tool
        return _finding(index, param, output, problem, subject, call_id=call_id, blocking=blocking)

    def find_call(self, call_id: str) -> _Located | None:
        if call_id in self.seen_calls:
            position = self.seen_calls[call_id]
            return _Located(self.items[position], self.paths[position])
        if call_id in self.chain_calls:
            return _Located(self.chain_calls[call_id], CHAIN)
        return None

    def call_problem(self, call: JSON) -> _Problem | None:
        key = id(call)
        if key not in self.call_problems:
            self.call_problems[key] = _call_problem(call, self.toolbox)
        return self.call_problems[key]


def _finding(
    index: int, param: str, kind: str, problem: _Problem | None, subject: str,
    *, call_id: str | None, name: str | None = None, blocking: bool = True,
) -> Finding:
    if problem is None:
        return Finding(index, param, kind, Reason.OK, call_id=call_id, name=name, blocking=blocking)
    return Finding(index, param, kind, problem.reason, f"{subject} {problem.text}", call_id, name, blocking,
                   problem.undefined_tool)


# ---------------------------------------------------------------- checks of one call


def _call_problem(call: JSON, toolbox: _Toolbox) -> _Problem | None:
    """The call checks from ``status`` to ``arguments_schema``, first failure wins."""
    status = call.get("status")
    if status is not None and status != "completed":
        return _Problem(
            Reason.STATUS,
            f"has status {_show(status)}, not 'completed': an unfinished call may carry truncated "
            "arguments and must never be answered. Drop the call and its output, and let the model "
            "call the tool again.",
        )
    if call.get("type") == "custom_tool_call":
        return _custom_call_problem(call, toolbox)
    arguments = call.get("arguments")
    if not isinstance(arguments, str):
        what = "no arguments" if arguments is None else f"arguments that are {_kind_of(arguments)}"
        return _Problem(
            Reason.ARGUMENTS_TYPE,
            f"has {what}, not a string. Send arguments as a string of JSON, exactly as the model "
            'produced it (e.g. "{\\"city\\": \\"Paris\\"}").',
        )
    try:
        value = json.loads(arguments, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError, RecursionError) as exc:
        detail = (
            f"{exc.msg} at line {exc.lineno} column {exc.colno}"
            if isinstance(exc, json.JSONDecodeError)
            else str(exc) or "nested too deeply"
        )
        return _Problem(
            Reason.ARGUMENTS_PARSE,
            f"has arguments that are not valid JSON ({detail}). Send the arguments exactly as the "
            "model produced them: a JSON object encoded as a string.",
        )
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return _Problem(Reason.UNKNOWN_TOOL, "names no function. Set name to the function that was called.")
    if not isinstance(value, dict):
        return _Problem(
            Reason.ARGUMENTS_SCHEMA,
            f"has arguments that encode {_kind_of(value)}; function arguments are always a JSON "
            "object of named parameters. Send an object, e.g. \"{}\" when there are none.",
        )
    tool = toolbox.by_name.get(_called_name(call) or name)
    if tool is None:
        return _Problem(
            Reason.UNKNOWN_TOOL,
            f"calls {name!r}, which is defined neither in this request's tools nor by the responses "
            f"{CHAIN}, so its arguments cannot be checked. Add the function's definition to tools.",
            undefined_tool=True,
        )
    return _schema_problem(tool, value, toolbox.limits)


def _custom_call_problem(call: JSON, toolbox: _Toolbox) -> _Problem | None:
    """A custom tool's call: its ``input`` is a string and, when the tool is defined,
    matches the tool's format (checked as the one-string schema a model is offered)."""
    text = call.get("input")
    if not isinstance(text, str):
        return _Problem(Reason.ARGUMENTS_TYPE, f"has an input that is {_kind_of(text)}, not a string. "
                        "Send the input exactly as the model produced it.")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return _Problem(Reason.UNKNOWN_TOOL, "names no tool. Set name to the custom tool that was called.")
    tool = toolbox.by_name.get(name)
    if tool is None:
        return _Problem(Reason.UNKNOWN_TOOL, f"calls {name!r}, which is not a custom tool of this request, so "
                        "its input cannot be checked. Add the tool to tools.", undefined_tool=True)
    return _schema_problem(tool, {CUSTOM_INPUT: text}, toolbox.limits)


def _schema_problem(tool: _Tool, value: dict[str, Any], limits: SchemaLimits) -> _Problem | None:
    if tool.parameters is None:
        return None
    where = tool.param or f"as offered {CHAIN}"
    compiled = compile_schema(tool.parameters, limits)
    if compiled.validator is None:
        return _Problem(
            Reason.INVALID_TOOL_SCHEMA,
            f"calls {tool.name!r}, whose parameters ({where}) are not a valid JSON Schema, so its "
            f"arguments cannot be checked: {compiled.problem}. Fix the schema.",
        )
    try:
        error = compiled.first_error(value)
    except Unresolvable as exc:
        reference = getattr(exc, "ref", None) or str(exc)
        return _Problem(
            Reason.INVALID_TOOL_SCHEMA,
            f"calls {tool.name!r}, whose parameters ({where}) refer to {reference!r}, which does not "
            "resolve: remote references are never fetched. Put the definition under $defs and refer "
            "to it as '#/$defs/...'.",
        )
    except RecursionError:
        return _Problem(
            Reason.ARGUMENTS_SCHEMA,
            f"has arguments nested too deeply to check against the parameters of {tool.name!r}.",
        )
    if error is None:
        return None
    return _Problem(
        Reason.ARGUMENTS_SCHEMA,
        f"has arguments that do not match the parameters of {tool.name!r}: {error.json_path}: "
        f"{_clip(error.message)}. Fix the arguments (or the tool's parameters, if the schema is wrong).",
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# ---------------------------------------------------------------- Chat Completions shapes

_CALL_SHAPE = '{"type": "function_call", "call_id": <id>, "name": <function.name>, "arguments": <function.arguments>}'
_OUTPUT_SHAPE = '{"type": "function_call_output", "call_id": <tool_call_id>, "output": <content>}'


def _chat_envelope(item: JSON) -> str | None:
    """Why ``item`` is a Chat Completions shape, with its Responses equivalent, or ``None``."""
    kind = item.get("type")
    if kind in (None, "message"):
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
    if kind in ("function", "function_call") and isinstance(item.get("function"), Mapping):
        return (
            'This is a Chat Completions tool call ({"type": "function", "function": {...}}). In '
            f"Responses, a tool call is a flat function_call item: {_CALL_SHAPE}."
        )
    return None


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
    return "message" if kind is None and "role" in item else "item"


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _kind_of(value: Any) -> str:
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


def _show(value: Any) -> str:
    return _clip(repr(value) if isinstance(value, str) else json.dumps(value, default=str))


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 1] + "…"
