"""Tool search: deferred tools, the search that loads them, and what each backend sees.

A request may mark tools ``defer_loading`` (a function, a namespace, a namespace's
function, a custom tool) and offer OpenAI's ``tool_search`` tool. A deferred tool is not
shown to the model; the model searches, and what the search loads is callable from then
on. A ``tool_search_output`` item (made by a search here, or sent by a client) loads its
``tools`` where it stands in the conversation, for every later turn of the chain.

**What a model sees** (:class:`ToolSurface`). The request's tools that are not deferred,
in their order, then the search as a function named ``tool_search``: for a server-run
search (``execution`` ``server``, the default) a function of ``query`` (and an optional
``limit``) whose description lists what can be found (deferred namespaces and functions,
by name and the first line of their description); for a client-run one the client's own
description and parameters. Loaded tools are never added to that list: each
``tool_search_output`` becomes a tool message that describes the functions it loaded
(:func:`loaded_text`), so the prompt up to it (instructions, the tools, the turns before)
stays the same and a model's cached prefix survives. The loaded functions are passed to
the backend as ``GenerationRequest.late_tools``: callable, and, for a backend that sends a
tool list (Chat Completions), appended after ``tools``. A request with nothing deferred,
no ``tool_search`` tool and no loaded tools in its context gets exactly the tools it
always got. A backend that hosts tool search itself (a Responses upstream) is sent the
search and the deferred tools instead, as they came (``GenerationRequest.tool_search``).

**The search** (:class:`Catalog`): BM25 (k1 1.2, b 0.75) over the deferred functions, each
a document of its flat name, its own name, its namespace's name and description, its
description and its parameters' names and descriptions (the names counted twice); terms
are runs of ASCII letters and digits, lowercased, common English words (``a``, ``the``,
``to``...) left out, a plural ``s`` dropped. The best
``limit`` functions with a positive score, ties in the request's order. Functions of one
namespace are loaded as that namespace holding just them (:func:`loadable`).

The run of a server-side search within one response is :mod:`app.engine.tool_search_loop`.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from app.backends.base import HostedToolSearch, TextGrammar, ToolSearchExecution, ToolSpec
from app.engine.validation import to_invalid_request
from app.errors import InvalidRequest
from app.protocol.items import ToolSearchOutputParam
from app.protocol.responses import CreateResponseBody
from app.protocol.tools import (
    CustomToolParam,
    FunctionToolParam,
    NamespaceToolParam,
    OfferedFunction,
    SpecificFunctionParam,
    ToolParam,
    ToolSearchToolParam,
    offered_functions,
)
from app.schemas import SchemaLimits, compile_schema

SEARCH_FUNCTION = "tool_search"
"""The name a search is offered to (and called by) a model under."""
UNNAMED_CALL = "tool_search"
"""The call id a model is shown for a search item that carries none (OpenAI's server-run
searches may not)."""
DEFAULT_RESULTS = 5
DEFAULT_ROUNDS = 3
LISTED = 64
"""Deferred tools named in a server-run search's description, at most."""


@dataclass(frozen=True, slots=True)
class ToolSearchLimits:
    results: int = DEFAULT_RESULTS
    """Functions one server-run search loads at most (the model may ask for fewer)."""
    rounds: int = DEFAULT_ROUNDS
    """Server-run searches one response may make."""


def function_spec(function: OfferedFunction, positions: Mapping[int, int] | None = None) -> ToolSpec:
    """``function`` as a backend is told of it. A custom tool's Lark grammar travels with
    it, with the parameter it came from (``positions``: each request tool's index, by the
    tool object's ``id``; a tool loaded by a search is named ``tools``)."""
    grammar = None
    if function.lark is not None:
        index = (positions or {}).get(id(function.tool))
        grammar = TextGrammar("lark", function.lark,
                              "tools" if index is None else f"tools[{index}].format.definition")
    return ToolSpec(name=function.name, description=function.description, parameters=function.parameters,
                    strict=function.strict, grammar=grammar)


# ---------------------------------------------------------------- the request's tools


def check_tools(body: CreateResponseBody, limits: SchemaLimits) -> ToolSearchToolParam | None:
    """The request's ``tool_search`` tool, once its tools hold together: one such tool at
    most, no function named ``tool_search`` beside it, a client's ``parameters`` a usable
    schema, and no deferred tool without it (each a 400 naming the tool)."""
    search: ToolSearchToolParam | None = None
    for index, tool in enumerate(body.tools or ()):
        if isinstance(tool, ToolSearchToolParam):
            if search is not None:
                raise InvalidRequest("Only one tool_search tool may be given.", code="invalid_value",
                                     param=f"tools[{index}]")
            search = tool
            if tool.parameters is not None and (problem := compile_schema(tool.parameters, limits).problem):
                raise InvalidRequest(f"The parameters of the tool_search tool cannot be used as a JSON Schema "
                                     f"(Draft 2020-12): {problem}.", code="invalid_tool_schema",
                                     param=f"tools[{index}].parameters")
    for index, tool in enumerate(body.tools or ()):
        if search is not None and isinstance(tool, FunctionToolParam | CustomToolParam) and \
                tool.name == SEARCH_FUNCTION:
            raise InvalidRequest(f"A tool may not be named '{SEARCH_FUNCTION}' beside the tool_search tool: the "
                                 "model calls the search by that name.", code="duplicate_tool_name",
                                 param=f"tools[{index}].name")
        if search is None and (where := _deferred_at(tool)) is not None:
            raise InvalidRequest(
                "This tool is deferred (defer_loading) but the request offers no tool_search tool, so the "
                'model could never load it: add {"type": "tool_search"} to tools, or remove defer_loading.',
                code="tool_search_required", param=f"tools[{index}]{where}.defer_loading")
    return search


def _deferred_at(tool: object) -> str | None:
    """Where ``defer_loading`` is set on ``tool`` (relative to it), if anywhere."""
    if isinstance(tool, FunctionToolParam | CustomToolParam | NamespaceToolParam) and tool.defer_loading:
        return ""
    if isinstance(tool, NamespaceToolParam):
        return next((f".tools[{at}]" for at, inner in enumerate(tool.tools) if inner.defer_loading), None)
    return None


_LOADED: TypeAdapter[Any] = TypeAdapter(ToolParam)


class _Tools(BaseModel):
    """The ``tools`` of a ``tool_search_output``, parsed as a request's are."""

    model_config = ConfigDict(extra="forbid")
    tools: list[ToolParam]


def check_loaded(items: Sequence[object]) -> None:
    """Each ``tool_search_output`` of the request's input holds tool definitions as
    ``tools`` takes them; the first that does not is a 400 naming it."""
    for index, item in enumerate(items):
        if isinstance(item, ToolSearchOutputParam):
            data = {"tools": item.tools}
            try:
                _Tools.model_validate(data)
            except ValidationError as exc:
                error = to_invalid_request(exc, data, _Tools)
                error.param = f"input[{index}].{error.param}" if error.param else f"input[{index}].tools"
                raise error from None


def loaded_functions(tools: Iterable[Any]) -> list[OfferedFunction]:
    """The functions that tool definitions (a ``tool_search_output``'s, checked) load."""
    parsed = []
    for tool in tools:
        try:
            parsed.append(_LOADED.validate_python(tool))
        except ValidationError:
            continue  # a stored item was checked when it came: nothing to do with one that was not
    return offered_functions(parsed)


@dataclass(slots=True)
class ToolSurface:
    """What a request's model is offered (see the module docstring), made by
    :func:`tool_surface`."""

    tools: tuple[ToolSpec, ...]
    """Shown with the prompt: the functions not deferred, then the search function."""
    late_tools: tuple[ToolSpec, ...] = ()
    """Loaded by the ``tool_search_output`` items of the context."""
    hosted: HostedToolSearch | None = None
    """For a backend that hosts tool search itself."""
    execution: ToolSearchExecution | None = None
    """``server`` or ``client`` when the request offers a search."""
    runs_here: bool = False
    """A server-run search this server runs (:mod:`app.engine.tool_search_loop`)."""
    offered: dict[str, OfferedFunction] = field(default_factory=dict)
    """Every function a call may name, by flat name: namespace and custom ones (the
    builder's, to answer in their own shape), deferred and loaded ones (a search's
    output names them)."""
    catalog: Catalog | None = None
    limits: ToolSearchLimits = ToolSearchLimits()

    @property
    def searches(self) -> bool:
        return self.execution is not None


def tool_surface(body: CreateResponseBody, context: Iterable[object], *, hosts_search: bool,
                 limits: ToolSearchLimits, schema_limits: SchemaLimits) -> ToolSurface:
    """The tools of ``body`` as its backend gets them, ``context`` being the items of the
    conversation (the chain's, then the input) whose ``tool_search_output`` items loaded
    tools."""
    search = check_tools(body, schema_limits)
    positions = {id(tool): index for index, tool in enumerate(body.tools or ())}
    functions = body.function_tools
    visible = [function for function in functions if not function.deferred]
    deferred = [function for function in functions if function.deferred]
    names = {function.name for function in visible}
    revealed: list[OfferedFunction] = []
    for item in context:
        if isinstance(item, ToolSearchOutputParam):
            for function in loaded_functions(item.tools):
                if function.name not in names:
                    names.add(function.name)
                    revealed.append(function)
    offered = {f.name: f for f in visible if f.namespace or f.custom}
    if search is None and not revealed:
        return ToolSurface(tuple(function_spec(function, positions) for function in visible), offered=offered)
    offered |= {f.name: f for f in (*deferred, *revealed)}
    late = tuple(function_spec(function, positions) for function in revealed)
    shown = tuple(function_spec(function, positions) for function in visible)
    if search is None:
        return ToolSurface(shown, late, offered=offered)
    execution: ToolSearchExecution = search.execution or "server"
    if hosts_search:
        hosted = HostedToolSearch(execution, tuple(function_spec(function, positions) for function in deferred),
                                  search.description, search.parameters)
        return ToolSurface(shown, late, hosted=hosted, execution=execution, offered=offered)
    if execution == "client":
        searcher = ToolSpec(SEARCH_FUNCTION, search.description or CLIENT_DESCRIPTION,
                            search.parameters or _parameters(None))
        return ToolSurface((*shown, searcher), late, execution=execution, offered=offered)
    if not deferred:  # nothing to find: no search to offer
        return ToolSurface(shown, late, offered=offered)
    return ToolSurface((*shown, _search_spec(search, deferred, limits)), late, execution=execution,
                       runs_here=True, offered=offered, catalog=Catalog(deferred), limits=limits)


def check_choice(body: CreateResponseBody, surface: ToolSurface) -> None:
    """A ``tool_choice`` that names a deferred function nothing has loaded is a 400: the
    model cannot call what it has not found."""
    choice = body.tool_choice
    if not isinstance(choice, SpecificFunctionParam):
        return
    function = surface.offered.get(choice.name)
    if function is not None and function.deferred and all(tool.name != choice.name for tool in surface.late_tools):
        raise InvalidRequest(f"tool_choice names '{choice.name}', a deferred tool that no tool search has loaded "
                             "yet: the model cannot call it.", code="invalid_value", param="tool_choice.name")


HOSTED_DESCRIPTION = (
    "Search for more tools. Their definitions are not loaded yet; the tools a search finds are loaded, and "
    "can then be called like the others. Describe the tool you need in a few words."
)
CLIENT_DESCRIPTION = "Search for tools that are not loaded yet; the tools found can then be called."


def _parameters(results: int | None) -> dict[str, Any]:
    limit = f"At most this many tools (default {results})." if results else "At most this many tools."
    return {"type": "object", "properties": {
        "query": {"type": "string", "description": "Words that describe the tool you need."},
        "limit": {"type": "integer", "minimum": 1, "description": limit},
    }, "required": ["query"], "additionalProperties": False}


def _search_spec(search: ToolSearchToolParam, deferred: Sequence[OfferedFunction],
                 limits: ToolSearchLimits) -> ToolSpec:
    listed: dict[str, str] = {}
    for function in deferred:
        group = function.namespace
        key = group.name if group is not None else function.function
        if key not in listed:
            about = (group.description if group is not None else function.tool.description) or ""
            listed[key] = about.strip().split("\n", 1)[0][:120]
    lines = [f"- {name}: {about}" if about else f"- {name}" for name, about in list(listed.items())[:LISTED]]
    if len(listed) > LISTED:
        lines.append(f"- and {len(listed) - LISTED} more")
    description = search.description or HOSTED_DESCRIPTION
    if lines:
        description += "\n\nWhat can be found:\n" + "\n".join(lines)
    return ToolSpec(SEARCH_FUNCTION, description, _parameters(limits.results))


# ---------------------------------------------------------------- what a search loads


def loaded_text(functions: Sequence[OfferedFunction]) -> str:
    """A ``tool_search_output`` as a model reads it: the functions it loaded, one JSON
    object each, as tools are described to a model that has no tools section."""
    if not functions:
        return "No tools were found."
    listing = "\n".join(json.dumps({
        "name": function.name, "description": function.description or "",
        "parameters": function.parameters or {"type": "object", "properties": {}},
    }, ensure_ascii=False) for function in functions)
    return f"These tools are loaded now and can be called:\n{listing}"


def loadable(functions: Sequence[OfferedFunction]) -> list[dict[str, Any]]:
    """Functions as a ``tool_search_output`` carries them: tool definitions as the
    request gave them, a namespace's functions inside that namespace (once, in the
    order first found)."""
    tools: list[dict[str, Any]] = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for function in functions:
        own = function.tool.model_dump(mode="json", exclude_none=True)
        group = function.namespace
        if group is None:
            tools.append(own)
        elif group.name in groups:
            groups[group.name].append(own)
        else:
            groups[group.name] = [own]
            tools.append(group.model_dump(mode="json", exclude_none=True, exclude={"tools"})
                         | {"tools": groups[group.name]})
    return tools


# ---------------------------------------------------------------- the ranking

_TERM = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    "a an and are as at be by can do for from how i in is it me my of on or that the this to use want we what "
    "with you your".split())
K1, B = 1.2, 0.75


def terms(text: str) -> list[str]:
    """Lowercased runs of ASCII letters and digits, common English words left out, a
    plural ``s`` dropped."""
    return [word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word
            for word in _TERM.findall(text.lower()) if word not in _STOPWORDS]


def _document(function: OfferedFunction) -> list[str]:
    group = function.namespace
    names = [function.name, function.function, group.name if group else ""]
    texts = [group.description or "" if group else "", function.tool.description or ""]
    parameters = function.parameters
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    for name, schema in (properties.items() if isinstance(properties, Mapping) else ()):
        texts.append(str(name))
        if isinstance(schema, Mapping) and isinstance(schema.get("description"), str):
            texts.append(schema["description"])
    return [*terms(" ".join(names)) * 2, *terms(" ".join(texts))]


class Catalog:
    """The deferred functions of one request, ranked by BM25 (see the module docstring)."""

    def __init__(self, functions: Sequence[OfferedFunction]) -> None:
        self.functions = list(functions)
        self._counts = [Counter(_document(function)) for function in self.functions]
        self._lengths = [sum(counts.values()) for counts in self._counts]
        self._average = (sum(self._lengths) / len(self._lengths)) if self._lengths else 0.0
        frequency: Counter[str] = Counter()
        for counts in self._counts:
            frequency.update(counts.keys())
        total = len(self.functions)
        self._idf = {term: math.log(1 + (total - seen + 0.5) / (seen + 0.5)) for term, seen in frequency.items()}

    def search(self, query: str, limit: int) -> list[OfferedFunction]:
        """The best ``limit`` functions for ``query`` (none when nothing matches)."""
        wanted = set(terms(query))
        scored = []
        for position, counts in enumerate(self._counts):
            score = 0.0
            norm = K1 * (1 - B + B * self._lengths[position] / (self._average or 1))
            for term in wanted:
                count = counts.get(term)
                if count:
                    score += self._idf[term] * count * (K1 + 1) / (count + norm)
            if score > 0:
                scored.append((-score, position))
        scored.sort()
        return [self.functions[position] for _, position in scored[:max(0, limit)]]
