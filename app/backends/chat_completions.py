"""A backend that forwards generation to an OpenAI-compatible Chat Completions upstream.

Ollama, vLLM, llama.cpp's server, llama-cpp-python's server, LM Studio and OpenAI all speak
``POST {base_url}/chat/completions`` with ``stream: true``. This module maps a
:class:`GenerationRequest` onto that request, decodes the upstream's Server-Sent Events into
the normalized deltas of :mod:`app.backends.base` (with :mod:`app.backends.chat_stream`), and
translates every upstream failure into :mod:`app.errors` at one boundary,
:mod:`app.backends.chat_errors`.

A request whose output nobody sees before it ends (``GenerationRequest.incremental`` off:
a plain JSON answer) is sent with ``stream: false``, and its one JSON body is decoded into
the same deltas: no event per token to make upstream or to parse here. The read timeout
then spans the whole generation, as the client's own does.

Error codes raised here:

    upstream_unavailable   the upstream could not be reached (connect failure, HTTP 503)
    upstream_timeout       it was reached but did not answer in time (read timeout, 504)
    upstream_disconnected  the stream broke, or ended before the model finished
    upstream_auth          it refused this server's credentials (401/403); the client is not at fault
    upstream_rejected      it refused the request (other 4xx)                  -> InvalidRequest
    upstream_rate_limited  it is rate limiting (429)                           -> TooManyRequests
    upstream_error         5xx, an error object inside the stream, or a malformed stream
    server_busy            every pooled connection to it stayed in use (429, retry shortly)

404 for an unknown model becomes ``ModelNotFound`` (param ``model``); a context overflow
becomes ``ContextLengthExceeded``. Client-facing messages never name the upstream's address,
and carry the upstream's own words only where they describe the client's request; the log
has the rest.

Dialects differ in two places that cannot be detected safely, so they are settings:

* ``token_limit_field``: ``max_tokens`` (default) is understood by every server above;
  OpenAI's reasoning models accept only ``max_completion_tokens``, which llama-cpp-python
  silently ignores, and OpenAI rejects a request that carries both.
* ``schema_style``: ``json_schema`` (default) sends OpenAI's
  ``{"type": "json_schema", "json_schema": {...}}``; llama-cpp-python's server only accepts
  ``{"type": "json_object", "schema": {...}}`` (``json_object_schema``) and answers the
  standard form with HTTP 500.

A user message's images go as ``image_url`` parts (the URL and ``detail`` as the client
gave them; an image known only by ``file_id`` stays a marker, Chat Completions has no such
part), its files as ``file`` parts (``file_data``/``file_id`` and ``filename``) where
the dialect option ``file_parts`` says the upstream takes them, else as their text (or a
marker): see :mod:`app.backends.parts`. An upstream declared text-only
(``input_modalities``) gets every message as text. A 400 naming a part it was sent is
mapped back to the client's path (:mod:`app.backends.media_params`).

``developer`` messages are sent as ``system``: several servers reject the newer role. An
assistant message's ``phase`` (``commentary`` / ``final_answer``) is forwarded as a field
of the message, as OpenAI's own API carries it; servers that do not know it ignore it.
Prior reasoning is not replayed unless ``replay_reasoning`` is set (as ``reasoning_content``;
DeepSeek-style APIs reject it in some versions and require it in others).

Logprobs (``sampling.logprobs``) are asked as ``logprobs: true, top_logprobs: N`` and read
from ``choices[0].logprobs.content`` (:mod:`app.backends.chat_stream`). An upstream that
refuses them with a 4xx naming logprobs is a 400 with ``param: "include"``; one that
silently sends none leaves the text without logprobs (an empty list), logged once per
response.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from app.backends.base import (
    TEXT_AND_IMAGES,
    ChatMessage,
    ContentPart,
    Delta,
    FilePart,
    GenerationRequest,
    ImagePart,
    InputModality,
    OutputFormat,
    ToolPolicy,
    ToolSpec,
)
from app.backends.chat_errors import error_for_status, json_or_text
from app.backends.chat_stream import ChunkDecoder
from app.backends.http_client import Pool, TlsFiles
from app.backends.media_params import chat_param, upstream_param
from app.backends.message_json import MessageJson, dumps
from app.backends.tool_names import names_back, wire_name
from app.backends.upstream_http import DEFAULT_TIMEOUT, AnswerDecoder, HttpUpstream, Timeouts
from app.errors import InvalidRequest, ORSError

logger = logging.getLogger("ors.upstream")
PATH = "/chat/completions"
"""Where this wire API's requests go, below the upstream's base URL."""

TokenLimitField = Literal["max_tokens", "max_completion_tokens"]
SchemaStyle = Literal["json_schema", "json_object_schema"]


@dataclass(frozen=True)
class ChatDialect:
    """The dialect options of a Chat Completions upstream (see the module docstring), by
    the names of :class:`ChatCompletionsBackend`'s keyword arguments: the options a
    configuration file's ``[upstreams.NAME.dialect]`` table may set, and their defaults."""

    token_limit_field: TokenLimitField = "max_tokens"
    """Which field carries ``max_output_tokens``."""
    schema_style: SchemaStyle = "json_schema"
    """How a JSON Schema output format is asked for."""
    replay_reasoning: bool = False
    """Send prior reasoning back as ``reasoning_content`` on assistant messages."""
    file_parts: bool = False
    """Send a file as a ``file`` content part (OpenAI's); off, as its text or a marker
    (most other servers refuse the part)."""
    named_tool_choice: bool = True
    """Name the function a required call must be (``{"type": "function", …}``); off, a
    required call is ``"required"`` among only the tools it may be (llama.cpp's own
    server reads ``tool_choice`` as a string alone, and takes an object for ``auto``)."""


class ChatCompletionsBackend(HttpUpstream):
    """Serves models from one OpenAI-compatible Chat Completions upstream.

    The address, key, allow-list (``models``), client and model list are
    :class:`~app.backends.upstream_http.HttpUpstream`'s; the dialect options are
    :class:`ChatDialect`'s.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        models: Sequence[str] | None = None,
        timeout: Timeouts = DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        token_limit_field: TokenLimitField = ChatDialect.token_limit_field,
        schema_style: SchemaStyle = ChatDialect.schema_style,
        replay_reasoning: bool = ChatDialect.replay_reasoning,
        file_parts: bool = ChatDialect.file_parts,
        named_tool_choice: bool = ChatDialect.named_tool_choice,
        owned_by: str = "upstream",
        pool: Pool = Pool(),
        tls: TlsFiles | None = None,
        input_modalities: Sequence[InputModality] = TEXT_AND_IMAGES,
        model_input_modalities: Mapping[str, Sequence[InputModality]] | None = None,
    ) -> None:
        super().__init__(base_url, api_key=api_key, models=models, timeout=timeout, headers=headers,
                         owned_by=owned_by, pool=pool, tls=tls, input_modalities=input_modalities,
                         model_input_modalities=model_input_modalities)
        self.file_parts = file_parts
        self._message_json = {media: MessageJson(lambda message, media=media: dumps(self._message(message, media)))
                              for media in (False, True)}  # a message's JSON with its parts, or as text
        self.token_limit_field: TokenLimitField = token_limit_field
        self.schema_style: SchemaStyle = schema_style
        self.replay_reasoning = replay_reasoning
        self.named_tool_choice = named_tool_choice

    # -- generation --------------------------------------------------------------------------

    def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        """Stream one chat completion as normalized deltas, ending with exactly one
        ``Finish`` (see :meth:`HttpUpstream.deltas`: closing, the one retry). A stream
        that ends (or breaks) before the upstream reported a ``finish_reason`` or sent
        ``[DONE]`` raises ``ModelError`` instead of passing off truncated output as
        complete."""
        payload = self.payload(request, messages=False)
        top_logprobs = (request.sampling.top_logprobs or 0) if request.sampling.logprobs else None
        logprobs = bool(payload.get("logprobs"))

        def refused(status: int, body: bytes, url: str) -> ORSError:
            error = error_for_status(status, body, model=request.model, url=url, logprobs=logprobs)
            if type(error) is InvalidRequest and error.param is None:
                error.param = chat_param(upstream_param(json_or_text(body.decode("utf-8", "replace"))),
                                         request.messages)
            return error

        def finished(decoder: AnswerDecoder, url: str) -> None:
            if isinstance(decoder, ChunkDecoder) and decoder.missing_logprobs:
                logger.warning("the upstream at %s sent no logprobs for model %s although they were asked",
                               url, request.model)

        return self.deltas(
            PATH, self._body(payload, request), stream=payload["stream"],
            decoder=lambda: ChunkDecoder(request.sampling.max_output_tokens, top_logprobs=top_logprobs),
            refused=refused, back=names_back((*request.tools, *request.late_tools)), finished=finished)

    def payload(self, request: GenerationRequest, *, messages: bool = True) -> dict[str, Any]:
        """The Chat Completions request body for ``request`` (streaming unless the
        request's output is wanted only whole); without ``messages``, all of it but the
        messages (see :meth:`_body`)."""
        body: dict[str, Any] = {"model": request.model}
        if messages:
            media = self.takes_images(request.model)
            body["messages"] = [self._message(message, media) for message in request.messages]
        if request.incremental:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        else:
            body["stream"] = False
        if request.tools or request.late_tools:
            # Every tool stays visible (a stable prompt prefix); ``allowed`` is enforced downstream.
            # Tools a search loaded come last, so the list before them stays the same.
            tools = (*request.tools, *request.late_tools) if request.late_tools else request.tools
            policy = request.tool_policy
            if not self.named_tool_choice and policy.mode == "required" and policy.allowed is not None:
                tools = tuple(tool for tool in tools if tool.name in policy.allowed)  # "required" among these
            body["tools"] = [_tool(spec) for spec in tools]
            choice = _tool_choice(policy, tools, named=self.named_tool_choice)
            if choice is not None:
                body["tool_choice"] = choice
            if not request.tool_policy.parallel:
                body["parallel_tool_calls"] = False
        sampling = request.sampling
        optional = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            self.token_limit_field: sampling.max_output_tokens,
            "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            "reasoning_effort": request.reasoning_effort,
            "response_format": self._response_format(request.output_format),
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        if sampling.logprobs:
            body.update(logprobs=True, top_logprobs=sampling.top_logprobs or 0)
        return body

    def _body(self, payload: dict[str, Any], request: GenerationRequest) -> bytes:
        """The request body: ``payload`` with the messages spliced in, each message's JSON
        made once and kept (:mod:`app.backends.message_json`)."""
        return self._message_json[self.takes_images(request.model)].body(payload, "messages", request.messages)

    def _message(self, message: ChatMessage, media: bool = True) -> dict[str, Any]:
        """``message`` on the wire; with ``media``, a user message's images and files as parts."""
        role = "system" if message.role == "developer" else message.role
        out: dict[str, Any] = {"role": role, "content": message.content}
        if message.parts and role == "user" and media:
            out["content"] = [self._part(part) for part in message.parts]  # one a part: media_params
        if role == "assistant":
            if message.tool_calls:
                out["tool_calls"] = [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": wire_name(call.name), "arguments": call.arguments},
                    }
                    for call in message.tool_calls
                ]
            if self.replay_reasoning and message.reasoning:
                out["reasoning_content"] = message.reasoning
            if message.phase is not None:
                out["phase"] = message.phase
        if role == "tool":
            out["tool_call_id"] = message.tool_call_id or ""
        return out

    def _part(self, part: ContentPart) -> dict[str, Any]:
        if isinstance(part, ImagePart) and part.image_url is not None:
            image = {"url": part.image_url} if part.detail is None else {"url": part.image_url, "detail": part.detail}
            return {"type": "image_url", "image_url": image}
        if isinstance(part, FilePart) and self.file_parts and (part.file_data is not None or part.file_id is not None):
            fields = (("file_data", part.file_data), ("file_id", part.file_id), ("filename", part.filename))
            return {"type": "file", "file": {key: value for key, value in fields if value is not None}}
        return {"type": "text", "text": part.text}

    def _response_format(self, output: OutputFormat) -> dict[str, Any] | None:
        if output.kind == "json_object":
            return {"type": "json_object"}
        if output.kind != "json_schema":
            return None
        schema = output.schema or {"type": "object"}
        if self.schema_style == "json_object_schema":
            return {"type": "json_object", "schema": schema}
        spec: dict[str, Any] = {"name": output.name or "output", "schema": schema}
        if output.strict is not None:
            spec["strict"] = output.strict
        return {"type": "json_schema", "json_schema": spec}


def _tool(spec: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {
        "name": wire_name(spec.name),
        "parameters": spec.parameters if spec.parameters is not None else {"type": "object", "properties": {}},
    }
    if spec.description:
        function["description"] = spec.description
    if spec.strict is not None:
        function["strict"] = spec.strict
    return {"type": "function", "function": function}


def _tool_choice(policy: ToolPolicy, tools: Sequence[ToolSpec] = (), *,
                 named: bool = True) -> str | dict[str, Any] | None:
    """``None`` for plain ``auto``: every server defaults to it, and some reject it spelled out.
    ``required`` with a single candidate is sent as that named function (unless not
    ``named``), which more servers enforce (llama-cpp-python's server constrains a named
    call with a grammar but treats ``required`` as a hint)."""
    if policy.mode == "none":
        return "none"
    if policy.mode == "required":
        candidates = policy.allowed if policy.allowed is not None else tuple(tool.name for tool in tools)
        if len(candidates) == 1 and named:
            return {"type": "function", "function": {"name": wire_name(candidates[0])}}
        return "required"
    return None

