"""A server-run tool search within one response, for any backend.

:func:`searching` stands in for ``backend.stream(request)`` when the request offers a
server-run search that this server runs (:attr:`ToolSurface.runs_here
<app.engine.tool_search.ToolSurface.runs_here>`). It passes the model's deltas on as they
come, except its calls of the search function, which it holds. When the model stops
having called the search (and nothing else), each search is run over the request's
deferred tools (:class:`~app.engine.tool_search.Catalog`), reported as a
``ToolSearchCallDelta`` and a ``ToolSearchOutputDelta``, and the model is asked again, in
the same response: the conversation so far, then the model's turn (its text, its
reasoning, its search calls), then one tool message per search describing the functions it
loaded (:func:`~app.engine.tool_search.loaded_text`), those functions added to
``late_tools``. The prompt before them is the one the model just read, so its cached
prefix is used again.

One ``Finish`` ends it all, with the usage of every round added up. It ends the response
as the model's last round ended, or sooner: when a round calls other tools as well (their
calls go to the client, the searches are reported, and the client's turn comes first);
when a round was cut short (``length``, ``content_filter``: the held searches are not
run); and when the response has made :attr:`ToolSearchLimits.rounds
<app.engine.tool_search.ToolSearchLimits.rounds>` searches (a further one is not run,
logged). Each round gets what is left of ``max_output_tokens``. Closing the generator
closes the round's backend stream.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from app.backends.base import (
    Backend,
    ChatMessage,
    Delta,
    Finish,
    GenerationRequest,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSearchCallDelta,
    ToolSearchOutputDelta,
    ToolSearchResult,
    Usage,
)
from app.engine import ids
from app.engine.tool_search import SEARCH_FUNCTION, ToolSurface, function_spec, loaded_text
from app.engine.tools import BUDGET_STOPS

log = logging.getLogger("ors.tools")



async def searching(backend: Backend, request: GenerationRequest, surface: ToolSurface) -> AsyncIterator[Delta]:
    """The deltas of the response (see the module docstring)."""
    assert surface.catalog is not None
    used: Usage | None = None
    searched = 0
    offset = 0
    budget = request.sampling.max_output_tokens
    while True:
        turn_round = Round()
        relay = turn_round.relay(backend.stream(request), lambda name: name == SEARCH_FUNCTION,
                                 offset)
        async with contextlib.aclosing(relay) as relayed:
            async for delta in relayed:  # closing this generator closes the round's stream at once
                yield delta
        held, passed, said, thought, finish = (turn_round.held, turn_round.passed, turn_round.said,
                                               turn_round.thought, turn_round.finish)
        used = added_usage(used, finish.usage)
        if not held or finish.reason in BUDGET_STOPS or searched >= surface.limits.rounds:
            if held and finish.reason not in BUDGET_STOPS:
                log.warning("did not run a tool search of model %s: %d searches were made in this response",
                            request.model, searched)
            yield Finish(finish.reason, used)
            return
        calls: list[ToolCall] = []
        answers: list[ChatMessage] = []
        for pieces in held.values():
            call_id = pieces[0].call_id or ids.call_id()
            written = "".join(piece.arguments for piece in pieces)
            arguments = _arguments(written)
            found = surface.catalog.search(_query(arguments), _limit(arguments, surface.limits.results))
            searched += 1
            yield ToolSearchCallDelta(call_id, arguments, "server")
            yield ToolSearchOutputDelta(call_id, tuple(function.name for function in found), "server")
            loaded = tuple(function_spec(function) for function in found)
            calls.append(ToolCall(call_id, SEARCH_FUNCTION, written or "{}", tool_search="server"))
            answers.append(ChatMessage("tool", loaded_text(found), tool_call_id=call_id,
                                       loaded=ToolSearchResult(loaded, "server")))
            known = {tool.name for tool in (*request.tools, *request.late_tools)}
            request = dataclasses.replace(
                request, late_tools=(*request.late_tools, *(tool for tool in loaded if tool.name not in known)))
        if passed or (budget is not None and used is not None and used.output_tokens >= budget):
            yield Finish("tool_calls" if passed else "length", used)
            return
        turn = ChatMessage("assistant", "".join(said), tool_calls=tuple(calls), reasoning="".join(thought) or None)
        sampling = request.sampling if budget is None or used is None else dataclasses.replace(
            request.sampling, max_output_tokens=budget - used.output_tokens)
        request = dataclasses.replace(request, messages=(*request.messages, turn, *answers), sampling=sampling)
        offset += max(held) + 1


def _arguments(written: str) -> dict[str, Any]:
    """What the model asked for: its JSON object, or its text as the query."""
    try:
        value = json.loads(written) if written.strip() else {}
    except ValueError:
        return {"query": written}
    return value if isinstance(value, dict) else {"query": written}


def _query(arguments: dict[str, Any]) -> str:
    query = arguments.get("query")
    if isinstance(query, str):
        return query
    paths = arguments.get("paths")  # OpenAI's own searches name namespaces and functions
    return " ".join(path for path in paths if isinstance(path, str)) if isinstance(paths, list) else ""


def _limit(arguments: dict[str, Any], most: int) -> int:
    limit = arguments.get("limit")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
        return min(limit, most)
    return most


@dataclass
class Round:
    """One round of a server-run tool loop: the model's deltas passed on as they come
    (:meth:`relay`), except its calls of the functions the server runs, which are held;
    what the round said and thought, and how it finished, kept for the next round."""

    held: dict[int, list[ToolCallDelta]] = field(default_factory=dict)
    passed: set[int] = field(default_factory=set)
    said: list[str] = field(default_factory=list)
    thought: list[str] = field(default_factory=list)
    finish: Finish = field(default_factory=lambda: Finish("stop"))

    async def relay(self, stream: AsyncIterator[Delta], runs_here: Callable[[str | None], bool],
                    offset: int) -> AsyncGenerator[Delta, None]:
        """The round's deltas to pass on (calls renumbered after ``offset``, the calls of
        earlier rounds); ``stream`` is closed when the round ends, or when this is."""
        async with contextlib.aclosing(stream) as deltas:  # type: ignore[type-var]
            async for delta in deltas:
                if isinstance(delta, ToolCallDelta):
                    if delta.index in self.held or (delta.index not in self.passed and runs_here(delta.name)):
                        self.held.setdefault(delta.index, []).append(delta)
                        continue
                    self.passed.add(delta.index)
                    yield dataclasses.replace(delta, index=delta.index + offset)
                elif isinstance(delta, Finish):
                    self.finish = delta
                    return
                else:
                    if isinstance(delta, TextDelta):
                        self.said.append(delta.text)
                    elif isinstance(delta, ReasoningDelta):
                        self.thought.append(delta.text)
                    yield delta


def added_usage(total: Usage | None, more: Usage | None) -> Usage | None:
    """The usage of rounds added up (``None`` when neither is known); the MCP loop's too."""
    if total is None or more is None:
        return more or total
    return Usage(input_tokens=total.input_tokens + more.input_tokens,
                 output_tokens=total.output_tokens + more.output_tokens,
                 cached_tokens=total.cached_tokens + more.cached_tokens,
                 reasoning_tokens=total.reasoning_tokens + more.reasoning_tokens)
