"""The replay gate's checks of one call: may it be answered, and do its arguments fit?

:func:`call_problem` runs the checks from ``status`` to ``arguments_schema`` (their order
and meaning are listed in :mod:`app.engine.gate`) on a ``function_call`` or a
``custom_tool_call`` and returns the first that fails, or ``None``. The arguments are
held to the tool's ``parameters`` as :mod:`app.schemas` compiles them; a custom tool's
``input`` is held to the one-string schema the tool is offered as. A call that names no
tool of the :class:`~app.engine.gate_tools.Toolbox` fails ``unknown_tool`` with
``undefined_tool`` set, which the gate's unknown-tool policy may let pass.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from app.engine.gate_findings import CHAIN, Problem, Reason, clip, kind_of, show
from app.engine.gate_tools import Tool, Toolbox, called_name
from app.protocol.states import ItemStatus, ItemType
from app.protocol.tools import CUSTOM_INPUT
from app.schemas import SchemaLimits, UnresolvedReference, compile_schema

JSON = Mapping[str, Any]


def call_problem(call: JSON, toolbox: Toolbox) -> Problem | None:
    """The call checks from ``status`` to ``arguments_schema``, first failure wins."""
    status = call.get("status")
    if status is not None and status != ItemStatus.COMPLETED:
        return Problem(
            Reason.STATUS,
            f"has status {show(status)}, not 'completed': an unfinished call may carry truncated "
            "arguments and must never be answered. Drop the call and its output, and let the model "
            "call the tool again.",
        )
    if call.get("type") == ItemType.CUSTOM_TOOL_CALL:
        return _custom_call_problem(call, toolbox)
    arguments = call.get("arguments")
    if not isinstance(arguments, str):
        what = "no arguments" if arguments is None else f"arguments that are {kind_of(arguments)}"
        return Problem(
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
        return Problem(
            Reason.ARGUMENTS_PARSE,
            f"has arguments that are not valid JSON ({detail}). Send the arguments exactly as the "
            "model produced them: a JSON object encoded as a string.",
        )
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return Problem(Reason.UNKNOWN_TOOL, "names no function. Set name to the function that was called.")
    if not isinstance(value, dict):
        return Problem(
            Reason.ARGUMENTS_SCHEMA,
            f"has arguments that encode {kind_of(value)}; function arguments are always a JSON "
            "object of named parameters. Send an object, e.g. \"{}\" when there are none.",
        )
    tool = toolbox.find(called_name(call) or name)
    if tool is None:
        return Problem(
            Reason.UNKNOWN_TOOL,
            f"calls {name!r}, which is defined neither in this request's tools nor by the responses "
            f"{CHAIN}, so its arguments cannot be checked. Add the function's definition to tools.",
            undefined_tool=True,
        )
    return _schema_problem(tool, value, toolbox.limits)


def _custom_call_problem(call: JSON, toolbox: Toolbox) -> Problem | None:
    """A custom tool's call: its ``input`` is a string and, when the tool is defined,
    matches the tool's format (checked as the one-string schema a model is offered)."""
    text = call.get("input")
    if not isinstance(text, str):
        return Problem(Reason.ARGUMENTS_TYPE, f"has an input that is {kind_of(text)}, not a string. "
                       "Send the input exactly as the model produced it.")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return Problem(Reason.UNKNOWN_TOOL, "names no tool. Set name to the custom tool that was called.")
    tool = toolbox.find(name)
    if tool is None:
        return Problem(Reason.UNKNOWN_TOOL, f"calls {name!r}, which is not a custom tool of this request, so "
                       "its input cannot be checked. Add the tool to tools.", undefined_tool=True)
    return _schema_problem(tool, {CUSTOM_INPUT: text}, toolbox.limits)


def _schema_problem(tool: Tool, value: dict[str, Any], limits: SchemaLimits) -> Problem | None:
    """How ``value`` fails the tool's ``parameters``, or ``None`` when it fits (or the
    tool has none)."""
    if tool.parameters is None:
        return None
    where = tool.param or f"as offered {CHAIN}"
    compiled = compile_schema(tool.parameters, limits)
    if compiled.validator is None:
        return Problem(
            Reason.INVALID_TOOL_SCHEMA,
            f"calls {tool.name!r}, whose parameters ({where}) are not a valid JSON Schema, so its "
            f"arguments cannot be checked: {compiled.problem}. Fix the schema.",
        )
    try:
        error = compiled.first_error(value)
    except UnresolvedReference as exc:
        reference = exc.ref
        return Problem(
            Reason.INVALID_TOOL_SCHEMA,
            f"calls {tool.name!r}, whose parameters ({where}) refer to {reference!r}, which does not "
            "resolve: remote references are never fetched. Put the definition under $defs and refer "
            "to it as '#/$defs/...'.",
        )
    except RecursionError:
        return Problem(
            Reason.ARGUMENTS_SCHEMA,
            f"has arguments nested too deeply to check against the parameters of {tool.name!r}.",
        )
    if error is None:
        return None
    return Problem(
        Reason.ARGUMENTS_SCHEMA,
        f"has arguments that do not match the parameters of {tool.name!r}: {error.json_path}: "
        f"{clip(error.message)}. Fix the arguments (or the tool's parameters, if the schema is wrong).",
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
