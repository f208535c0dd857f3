"""Remote MCP tools run by this server within one response, for any backend.

:func:`mcp_running` stands in for the request's stream (``backend.stream``, or the tool
search loop's) when the request has ``mcp`` tools (:class:`McpSetup`). First, each
server's tools are listed (:mod:`app.backends.mcp_client`) and reported as an
``mcp_list_tools`` item, unless the conversation already holds one for that
``server_label`` (it is reused: the server is not asked again). Those ``allowed_tools``
are offered to the model as functions named ``label__tool``. Then the calls the client
approved in this request's ``mcp_approval_response`` items are run (a refused one is
told to the model as refused), and the model is asked.

The model's deltas pass on as they come, except its calls of MCP functions, which are
held. When its round ends with such calls, each is run: an ``mcp_call`` item with its
``output`` (cut past ``max_output_bytes``, with a note) or its ``error``; the model is
asked again in the same response with its turn and one tool message per call, and so on
until it answers. A call that needs approval (``require_approval``, ``always`` by
default as in OpenAI's API) is not run: an ``mcp_approval_request`` item, and the
response ends there. It also ends when a round calls the client's own tools as well
(they go to the client; the MCP calls of that round are run first), when a round was
cut short (``length``, ``content_filter``: nothing held is run), and when
``max_calls`` calls were made (a further one is not run, logged). ``tool_choice``
``required``, or ``{"type": "mcp", "server_label", "name"?}`` (one of that server's tools,
or the one named), holds for the first round only. One ``Finish`` ends it all, with every
round's usage added up; each round gets what is left of ``max_output_tokens``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from app.backends.base import (
    ChatMessage,
    Delta,
    Finish,
    GenerationRequest,
    McpApprovalRequestDelta,
    McpCallDelta,
    McpListToolsDelta,
    McpTool,
    ToolCall,
    ToolSpec,
    Usage,
)
from app.backends.mcp_client import McpFailure, McpServer, call_tool, list_tools
from app.engine import ids
from app.engine.mcp import McpLimits, mcp_result_text
from app.engine.tool_search_loop import Round, added_usage
from app.engine.tools import BUDGET_STOPS
from app.protocol.mcp import McpApprovalRequestParam
from app.protocol.tools import McpToolParam, qualified_name
from app.url_roots import UrlRoot

log = logging.getLogger("ors.tools")



@dataclass(frozen=True)
class Approval:
    """The client's answer to an ``mcp_approval_request`` of the conversation."""

    request: McpApprovalRequestParam
    approve: bool
    reason: str | None = None


@dataclass(frozen=True)
class McpSetup:
    """A request's MCP tools and what the conversation already knows of them."""

    tools: tuple[McpToolParam, ...]
    limits: McpLimits
    listed: Mapping[str, tuple[McpTool, ...]] = dataclasses.field(default_factory=dict)
    """Tools already listed in the conversation (its last ``mcp_list_tools`` per label)."""
    approvals: tuple[Approval, ...] = ()
    choice: tuple[str, str | None] | None = None
    """A ``tool_choice`` of type ``mcp``: the server's label, and the one tool it names."""


@dataclass(frozen=True)
class _Function:
    tool: McpToolParam
    name: str


def _server(tool: McpToolParam, limits: McpLimits) -> McpServer:
    headers = dict(tool.headers or {})
    if tool.authorization:
        headers["Authorization"] = f"Bearer {tool.authorization}"
    return McpServer(UrlRoot.parse(tool.server_url).url(), headers, limits.call_seconds)


async def mcp_running(stream: Callable[[GenerationRequest], AsyncIterator[Delta]], request: GenerationRequest,
                      setup: McpSetup) -> AsyncIterator[Delta]:
    """The deltas of the response (see the module docstring)."""
    functions: dict[str, _Function] = {}
    specs: list[ToolSpec] = []
    for tool in setup.tools:
        listed = setup.listed.get(tool.server_label)
        if listed is None:
            try:
                listed = tuple(await list_tools(_server(tool, setup.limits)))
                yield McpListToolsDelta(tool.server_label, listed)
            except McpFailure as failure:
                log.warning("could not list the tools of MCP server %r: %s", tool.server_label, failure)
                yield McpListToolsDelta(tool.server_label, (), str(failure))
                continue
        for found in listed:
            if tool.allows(found.name):
                name = qualified_name(tool.server_label, found.name)
                functions[name] = _Function(tool, found.name)
                specs.append(ToolSpec(name, found.description, found.input_schema or {"type": "object"}))
    request = dataclasses.replace(request, tools=(*request.tools, *specs))
    if setup.choice is not None:  # the model must call one of these (of this one) tools
        label, only = setup.choice
        chosen = tuple(name for name, function in functions.items()
                       if function.tool.server_label == label and only in (None, function.name))
        request = dataclasses.replace(request, tool_policy=dataclasses.replace(
            request.tool_policy, allowed=chosen, mode="required" if chosen else "auto"))
    if not request.tools and request.tool_policy.mode == "required":  # no server listed a tool to call
        request = dataclasses.replace(request, tool_policy=dataclasses.replace(request.tool_policy, mode="auto"))
    calls = 0
    done: list[ChatMessage] = []
    for approval in setup.approvals:
        asked = approval.request
        call = ToolCall(asked.id, qualified_name(asked.server_label, asked.name), asked.arguments or "{}")
        if approval.approve and calls < setup.limits.max_calls:
            server = next((t for t in setup.tools if t.server_label == asked.server_label), None)
            yield McpCallDelta(asked.server_label, asked.name, asked.arguments, approval_request_id=asked.id,
                               running=True)
            result = await _call(server, asked.name, asked.arguments, setup.limits, asked.id)
            calls += 1
            yield result
            text = mcp_result_text(result.output, result.error)
        elif approval.approve:
            text = f"This call was not run: this response made {calls} MCP calls, its limit."
        else:
            text = "The user refused this call" + (f": {approval.reason}" if approval.reason else ".")
        done += [ChatMessage("assistant", tool_calls=(call,)), ChatMessage("tool", text, tool_call_id=call.call_id)]
    if done:
        request = dataclasses.replace(request, messages=(*request.messages, *done))
    used: Usage | None = None
    offset = 0
    budget = request.sampling.max_output_tokens
    while True:
        turn_round = Round()
        relay = turn_round.relay(stream(request), lambda name: name in functions,
                                 offset)
        async with contextlib.aclosing(relay) as relayed:
            async for delta in relayed:  # closing this generator closes the round's stream at once
                yield delta
        held, passed, said, thought, finish = (turn_round.held, turn_round.passed, turn_round.said,
                                               turn_round.thought, turn_round.finish)
        used = added_usage(used, finish.usage)
        if not held or finish.reason in BUDGET_STOPS:
            yield Finish(finish.reason, used)
            return
        made: list[ToolCall] = []
        answers: list[ChatMessage] = []
        waiting = over = False
        for pieces in held.values():
            function = functions[pieces[0].name or ""]
            arguments = "".join(piece.arguments for piece in pieces) or "{}"
            if function.tool.needs_approval(function.name):
                waiting = True
                yield McpApprovalRequestDelta(ids.new_id("mcpr"), function.tool.server_label, function.name,
                                              arguments)
                continue
            if calls >= setup.limits.max_calls:
                over = True
                log.warning("did not run an MCP call of model %s: %d calls were made in this response",
                            request.model, calls)
                continue
            call_id = pieces[0].call_id or ids.call_id()
            yield McpCallDelta(function.tool.server_label, function.name, arguments, running=True)
            result = await _call(function.tool, function.name, arguments, setup.limits)
            calls += 1
            yield result
            made.append(ToolCall(call_id, qualified_name(function.tool.server_label, function.name), arguments))
            answers.append(ChatMessage("tool", mcp_result_text(result.output, result.error), tool_call_id=call_id))
        spent = budget is not None and used is not None and used.output_tokens >= budget
        if passed or waiting or over or spent or not made:
            yield Finish("tool_calls" if passed else ("length" if spent else "stop"), used)
            return
        turn = ChatMessage("assistant", "".join(said), tool_calls=tuple(made), reasoning="".join(thought) or None)
        sampling = request.sampling if budget is None or used is None else dataclasses.replace(
            request.sampling, max_output_tokens=budget - used.output_tokens)
        policy = request.tool_policy
        if policy.mode == "required":
            policy = dataclasses.replace(policy, mode="auto", allowed=None)
        request = dataclasses.replace(request, messages=(*request.messages, turn, *answers), sampling=sampling,
                                      tool_policy=policy)
        offset += max(held) + 1


async def _call(tool: McpToolParam | None, name: str, arguments: str, limits: McpLimits,
                approval_request_id: str | None = None) -> McpCallDelta:
    """One call, as its ``mcp_call``; never raises for the server's failures."""
    label = tool.server_label if tool is not None else ""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    if tool is None:
        return McpCallDelta(label, name, arguments, None, "the MCP tool is not in this request's tools",
                            approval_request_id)
    if not isinstance(value, dict):
        return McpCallDelta(label, name, arguments, None, "the arguments are not a JSON object", approval_request_id)
    try:
        result = await call_tool(_server(tool, limits), name, value)
    except McpFailure as failure:
        log.warning("MCP call of %r on server %r failed: %s", name, label, failure)
        return McpCallDelta(label, name, arguments, None, str(failure), approval_request_id)
    output = _cut(result.output, limits.max_output_bytes)
    if result.is_error:
        return McpCallDelta(label, name, arguments, None, output or "the tool failed", approval_request_id)
    return McpCallDelta(label, name, arguments, output, None, approval_request_id)


def _cut(text: str, most: int) -> str:
    data = text.encode()
    if len(data) <= most:
        return text
    kept = data[:most].decode(errors="ignore")
    return f"{kept}\n[output cut: {len(data) - len(kept.encode())} more bytes past the limit of {most}]"
