"""A backend that forwards generation to an upstream that speaks Open Responses / OpenAI
Responses natively (``POST {base_url}/responses``): Ollama, vLLM, LM Studio, OpenAI, or
another ors.

The upstream is used statelessly: every turn sends the whole conversation (the
:class:`GenerationRequest`'s messages turned back into Responses input items) with
``stream: true`` and ``store: false``, and never a ``previous_response_id``. What the
client gets on top of it (storage and ``previous_response_id``, the WebSocket mode,
compaction, the replay gate, the tool-policy and output-format guards) is this server's,
as for any backend: the upstream only generates. Its stream is read for meaning by
:mod:`app.backends.responses_stream` and becomes the delta vocabulary; the client's
events are then made by the builder, so they are conformant whatever the upstream sends
(missing ``sequence_number``s, missing fields, final items that differ from the streamed
ones: see that module). Failures are mapped by :mod:`app.backends.responses_errors`.

The conversion back to items (:func:`input_items`): ``system``/``developer``/``user``
messages become ``message`` items with string content; an assistant message becomes an
``output_text`` message (with its ``phase``), then one ``function_call`` item per call; a
tool message a ``function_call_output``. Prior reasoning is sent back (a ``reasoning``
item with ``reasoning_text`` content, before the assistant's message) only with the
dialect option ``replay_reasoning``: upstreams that did not produce the reasoning
themselves may refuse it. A message (or a tool's output) that holds images or files is
sent as a list of parts, each as it came (``input_text``, ``input_image``, ``input_file``;
:mod:`app.backends.parts`), unless the upstream is declared text-only
(``input_modalities``): then as text, with the engine's markers and a file's text. A 400
naming such a part is mapped back to the client's path (:mod:`app.backends.media_params`).

Tool search (dialect option ``native_tool_search``, on by default): the request's
``tool_search`` tool goes to the upstream as it came, with its deferred functions as
``defer_loading`` function tools after the others; the conversation's searches go as
``tool_search_call`` items (arguments as an object) and ``tool_search_output`` items
carrying the functions they loaded; the upstream's own search items come back as
``ToolSearchCallDelta``/``ToolSearchOutputDelta`` (:mod:`app.backends.responses_stream`).
With the option off, this server runs the search, as for any other backend.

One retry, invisible to the consumer, when the connection breaks before the upstream sent
a single event (a pooled keep-alive connection the server had just closed).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.backends.base import (
    TEXT_AND_IMAGES,
    ChatMessage,
    ContentPart,
    Delta,
    FilePart,
    GenerationRequest,
    HostedToolSearch,
    ImagePart,
    InputModality,
    OutputFormat,
    ToolCall,
    ToolPolicy,
    ToolSpec,
)
from app.backends.http_client import Pool, TlsFiles
from app.backends.media_params import responses_param
from app.backends.message_json import MessageJson, dumps
from app.backends.responses_errors import http_error
from app.backends.responses_stream import ResponsesEventDecoder
from app.backends.tool_names import names_back, wire_name
from app.backends.upstream_http import DEFAULT_TIMEOUT, HttpUpstream, Timeouts
from app.errors import ORSError
from app.protocol.states import ItemType

PATH = "/responses"
"""Where this wire API's requests go, below the upstream's base URL."""

LOGPROBS_INCLUDE = "message.output_text.logprobs"


@dataclass(frozen=True)
class ResponsesDialect:
    """The dialect options of a Responses upstream, by the names of
    :class:`ResponsesUpstreamBackend`'s keyword arguments (and of a configuration file's
    ``[upstreams.NAME.dialect]`` table)."""

    replay_reasoning: bool = False
    """Send prior reasoning back as ``reasoning`` items with ``reasoning_text`` content."""
    hold_text: bool = False
    """Hold text and reasoning until each upstream item is final and send only the final
    form (for an upstream whose streamed deltas cannot be trusted); off, text streams live."""
    native_tool_search: bool = True
    """Send a request's ``tool_search`` tool and its deferred tools to the upstream as they
    came, for the upstream to run the search (or hand it to the client); off, this server
    runs it and the upstream sees a search function (for an upstream without tool search)."""


class ResponsesUpstreamBackend(HttpUpstream):
    """Serves models from one upstream's ``/v1/responses`` (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        models: Sequence[str] | None = None,
        timeout: Timeouts = DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        replay_reasoning: bool = ResponsesDialect.replay_reasoning,
        hold_text: bool = ResponsesDialect.hold_text,
        native_tool_search: bool = ResponsesDialect.native_tool_search,
        owned_by: str = "upstream",
        pool: Pool = Pool(),
        tls: TlsFiles | None = None,
        input_modalities: Sequence[InputModality] = TEXT_AND_IMAGES,
        model_input_modalities: Mapping[str, Sequence[InputModality]] | None = None,
    ) -> None:
        super().__init__(base_url, api_key=api_key, models=models, timeout=timeout, headers=headers,
                         owned_by=owned_by, pool=pool, tls=tls, input_modalities=input_modalities,
                         model_input_modalities=model_input_modalities)
        self.replay_reasoning = replay_reasoning
        self.hold_text = hold_text
        self.hosts_tool_search = native_tool_search
        self._input_json = {media: MessageJson(lambda message, media=media: ",".join(
            dumps(item) for item in self._items((message,), media))) for media in (False, True)}

    def _items(self, messages: Sequence[ChatMessage], media: bool) -> list[dict[str, Any]]:
        return input_items(messages, replay_reasoning=self.replay_reasoning, searches=self.hosts_tool_search,
                           media=media)

    def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        """Stream one upstream response as deltas, ending with exactly one ``Finish`` (see
        :meth:`HttpUpstream.deltas`: closing, the one retry). A stream that ends before
        the upstream's terminal event raises ``ModelError`` (``upstream_disconnected``)."""
        payload = self.payload(request, input=False)
        top_logprobs = (request.sampling.top_logprobs or 0) if request.sampling.logprobs else None
        logprobs = LOGPROBS_INCLUDE in payload.get("include", ())

        def media(param: str | None) -> str | None:
            return responses_param(param, self._owners(request))

        def refused(status: int, body: bytes, url: str) -> ORSError:
            return http_error(status, body, model=request.model, url=url, logprobs=logprobs, media=media)

        return self.deltas(
            PATH, self._input_json[self.takes_images(request.model)].body(payload, "input", request.messages),
            stream=payload["stream"],
            decoder=lambda: ResponsesEventDecoder(hold_text=self.hold_text, top_logprobs=top_logprobs, media=media),
            refused=refused, back=names_back(_all_tools(request)))

    def _owners(self, request: GenerationRequest) -> list[ChatMessage]:
        """The message each item of the input sent was made from, item by item."""
        media = self.takes_images(request.model)
        return [message for message in request.messages for _ in self._items((message,), media)]

    def payload(self, request: GenerationRequest, *, input: bool = True) -> dict[str, Any]:
        """The ``POST /responses`` body for ``request``: stateless, and streaming unless
        the request's output is wanted only whole (then one response resource comes back,
        decoded into the same deltas); without ``input``, all of it but the input items
        (which :meth:`stream` splices in)."""
        body: dict[str, Any] = {"model": request.model}
        if input:
            body["input"] = self._items(request.messages, self.takes_images(request.model))
        body |= {"stream": request.incremental, "store": False}
        search = request.tool_search
        if request.tools or request.late_tools or search is not None:
            # Every tool stays visible (a stable prompt prefix); the policy says which may be called.
            # Tools a search loaded are the conversation's own for an upstream that searches itself.
            tools = request.tools if search is not None or not request.late_tools else \
                (*request.tools, *request.late_tools)
            body["tools"] = [_tool(spec) for spec in tools]
            if search is not None:
                body["tools"] += [_tool(spec) | {"defer_loading": True} for spec in search.deferred]
                body["tools"].append(_search_tool(search))
            choice = _tool_choice(request.tool_policy, tools)
            if choice is not None:
                body["tool_choice"] = choice
            if not request.tool_policy.parallel:
                body["parallel_tool_calls"] = False
            if request.tool_policy.max_calls is not None:
                body["max_tool_calls"] = request.tool_policy.max_calls
        sampling = request.sampling
        optional = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_output_tokens": sampling.max_output_tokens,
            "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            "reasoning": {"effort": request.reasoning_effort} if request.reasoning_effort else None,
            "text": _text(request.output_format),
            "prompt_cache_key": request.cache_key,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        if sampling.logprobs:
            body.update(include=[LOGPROBS_INCLUDE], top_logprobs=sampling.top_logprobs or 0)
        return body


def input_items(messages: Sequence[ChatMessage], *, replay_reasoning: bool = False,
                searches: bool = False, media: bool = True) -> list[dict[str, Any]]:
    """The conversation as Responses input items (see the module docstring); with
    ``searches``, tool searches as the upstream's own search items, else as calls of the
    search function; with ``media``, a message's parts as they came, else its text."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool" and message.loaded is not None and searches:
            items.append({"type": ItemType.TOOL_SEARCH_OUTPUT, "call_id": message.tool_call_id or "",
                          "execution": message.loaded.execution,
                          "tools": [_tool(spec) for spec in message.loaded.tools]})
        elif message.role == "tool":
            items.append({"type": ItemType.FUNCTION_CALL_OUTPUT, "call_id": message.tool_call_id or "",
                          "output": _content(message, media)})
        elif message.role != "assistant":
            items.append({"type": ItemType.MESSAGE, "role": message.role, "content": _content(message, media)})
        else:
            if replay_reasoning and message.reasoning:
                items.append({"type": ItemType.REASONING, "summary": [],
                              "content": [{"type": "reasoning_text", "text": message.reasoning}]})
            if message.content or not message.tool_calls:
                said: dict[str, Any] = {
                    "type": ItemType.MESSAGE, "role": "assistant",
                    "content": [{"type": "output_text", "text": message.content, "annotations": []}],
                }
                if message.phase is not None:
                    said["phase"] = message.phase
                items.append(said)
            items += [_call(call, searches) for call in message.tool_calls]
    return items


def _content(message: ChatMessage, media: bool) -> str | list[dict[str, Any]]:
    """A message's text, or its parts as the client sent them (one a part: media_params)."""
    return [_part(part) for part in message.parts] if media and message.parts else message.content


def _part(part: ContentPart) -> dict[str, Any]:
    if isinstance(part, ImagePart):
        fields: tuple[tuple[str, str | None], ...] = (
            ("image_url", part.image_url), ("file_id", part.file_id), ("detail", part.detail))
        return {"type": "input_image", **{key: value for key, value in fields if value is not None}}
    if isinstance(part, FilePart):
        fields = (("filename", part.filename), ("file_data", part.file_data), ("file_url", part.file_url),
                  ("file_id", part.file_id))
        return {"type": "input_file", **{key: value for key, value in fields if value is not None}}
    return {"type": "input_text", "text": part.text}


def _call(call: ToolCall, searches: bool) -> dict[str, Any]:
    if call.tool_search is not None and searches:
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            arguments = {}
        return {"type": ItemType.TOOL_SEARCH_CALL, "call_id": call.call_id, "execution": call.tool_search,
                "arguments": arguments if isinstance(arguments, dict) else {}}
    return {"type": ItemType.FUNCTION_CALL, "call_id": call.call_id, "name": wire_name(call.name),
            "arguments": call.arguments}


def _all_tools(request: GenerationRequest) -> tuple[ToolSpec, ...]:
    """Every function a call of the upstream may name."""
    deferred = request.tool_search.deferred if request.tool_search is not None else ()
    return (*request.tools, *request.late_tools, *deferred)


def _search_tool(search: HostedToolSearch) -> dict[str, Any]:
    tool: dict[str, Any] = {"type": "tool_search"}
    if search.execution == "client":
        tool["execution"] = "client"
        for key, value in (("description", search.description), ("parameters", search.parameters)):
            if value is not None:
                tool[key] = value
    return tool


def _tool(spec: ToolSpec) -> dict[str, Any]:
    tool: dict[str, Any] = {
        "type": "function",
        "name": wire_name(spec.name),
        "parameters": spec.parameters if spec.parameters is not None else {"type": "object", "properties": {}},
    }
    if spec.description:
        tool["description"] = spec.description
    if spec.strict is not None:
        tool["strict"] = spec.strict
    return tool


def _tool_choice(policy: ToolPolicy, tools: Sequence[ToolSpec]) -> str | dict[str, Any] | None:
    """``None`` for plain ``auto`` (the default everywhere); a named function when exactly
    one call is required of one tool; ``allowed_tools`` for a subset."""
    if policy.mode == "none":
        return "none"
    if policy.mode == "required":
        candidates = policy.allowed if policy.allowed is not None else tuple(tool.name for tool in tools)
        if len(candidates) == 1:
            return {"type": "function", "name": wire_name(candidates[0])}
    if policy.allowed is None:
        return "required" if policy.mode == "required" else None
    return {"type": "allowed_tools", "mode": policy.mode,
            "tools": [{"type": "function", "name": wire_name(name)} for name in policy.allowed]}


def _text(output: OutputFormat) -> dict[str, Any] | None:
    if output.kind == "json_object":
        return {"format": {"type": "json_object"}}
    if output.kind != "json_schema":
        return None
    fmt: dict[str, Any] = {"type": "json_schema", "name": output.name or "output",
                           "schema": output.schema or {"type": "object"}}
    if output.strict is not None:
        fmt["strict"] = output.strict
    return {"format": fmt}
