"""The tools a replayed call may name, as the replay gate looks them up.

A :class:`Toolbox` holds every function a call of the request may name, by the name a
call uses: the tools of the ``previous_response_id`` chain (the latest definition of a
name wins), then the request's own ``tools``, which win over the chain's. A ``namespace``
tool's functions are found by their flat name (``namespace__name``); a ``custom`` tool
is the function of one string it is offered as (its ``regex`` format that string's
pattern; a replayed input is not checked against a ``lark`` grammar).

The tools a tool search loaded (``tool_search_output`` items) are looked up last, and
only for a name nothing else defines: most requests never walk their chain for them.

Building the toolbox checks the request's own tools, whether or not a call uses them:
a name another tool before it already has is ``duplicate_tool_name`` (param
``tools[i].name``), and ``parameters`` that :mod:`app.schemas` does not admit are
``invalid_tool_schema`` (param ``tools[i].parameters``, or ``tools[i].format.definition``
for a custom tool's regex).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.engine.gate_findings import Finding, Reason
from app.protocol.tools import custom_parameters, qualified_name
from app.schemas import SchemaLimits, compile_schema


@dataclass(frozen=True, slots=True)
class Tool:
    """A function as a call is checked against it."""

    name: str
    parameters: Any
    param: str | None
    """``tools[i].parameters`` for a tool of this request, ``None`` for one of the chain."""


class Toolbox:
    """The functions by called name, and the findings on the request's own tools."""

    def __init__(self, tools: Iterable[Any], history_tools: Iterable[Any], limits: SchemaLimits,
                 loaded: Callable[[], Iterable[Any]] | None = None) -> None:
        self.limits = limits
        self._loaded = loaded
        self.by_name: dict[str, Tool] = {}
        for tool, _ in functions(history_tools, "tools"):
            if (name := function_name(tool)) is not None:
                self.by_name[name] = Tool(name, tool.get("parameters"), None)
        self.findings: list[Finding] = []
        own: dict[str, Tool] = {}
        first_at: dict[str, str] = {}
        for tool, path in functions(tools, "tools"):
            name = function_name(tool)
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
            own[name] = Tool(name, tool.get("parameters"), param)
            problem = self.schema_error(own[name], self.limits)
            if problem is not None:
                what = (f"The regex format of custom tool {name!r} cannot be used" if custom
                        else f"The parameters of function {name!r} cannot be used as a JSON Schema (Draft 2020-12)")
                self.findings.append(
                    Finding(None, param, "tool", Reason.INVALID_TOOL_SCHEMA, f"{what}: {problem}. Fix it.", name=name)
                )
        self.by_name.update(own)

    def find(self, name: str) -> Tool | None:
        """The function a call by ``name`` calls: the request's, else the chain's, else
        one a tool search loaded."""
        found = self.by_name.get(name)
        if found is None and self._loaded is not None:
            loaded, self._loaded = self._loaded, None
            for tool, _ in functions(loaded(), "tools"):
                if (called := function_name(tool)) is not None:
                    self.by_name.setdefault(called, Tool(called, tool.get("parameters"), None))
            found = self.by_name.get(name)
        return found

    @staticmethod
    def schema_error(tool: Tool, limits: SchemaLimits) -> str | None:
        if tool.parameters is None:
            return None
        return compile_schema(tool.parameters, limits).problem


def functions(tools: Iterable[Any], path: str) -> Iterable[tuple[Any, str]]:
    """Each entry of ``tools`` with its path, a ``namespace`` tool's functions in its
    place, each carrying the namespace (as an echoed namespaced function does), and a
    ``custom`` tool as the function of one string a model is offered (its ``regex``
    format the string's pattern; a ``lark`` one is not checked here)."""
    for index, tool in enumerate(tools):
        if isinstance(tool, Mapping) and tool.get("type") == "custom":
            fmt = tool.get("format")
            fmt = fmt if isinstance(fmt, Mapping) else {}
            regex = fmt.get("definition") if fmt.get("type") == "grammar" and fmt.get("syntax") == "regex" else None
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


def function_name(tool: Any) -> str | None:
    """The name a function tool is called by: its flat name when it has a namespace."""
    if not isinstance(tool, Mapping) or tool.get("type", "function") not in ("function", "custom"):
        return None
    return called_name(tool)


def called_name(item: Mapping[str, Any]) -> str | None:
    """``name``, qualified by ``namespace`` when the tool or call carries one."""
    name, namespace = item.get("name"), item.get("namespace")
    if not isinstance(name, str):
        return None
    return qualified_name(namespace, name) if isinstance(namespace, str) else name
