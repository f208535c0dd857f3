"""A backend that forwards generation to an OpenAI-compatible Chat Completions upstream.

Ollama, vLLM, llama.cpp's server, llama-cpp-python's server, LM Studio and OpenAI all speak
``POST {base_url}/chat/completions`` with ``stream: true``. This module maps a
:class:`GenerationRequest` onto that request, decodes the upstream's Server-Sent Events into
the normalized deltas of :mod:`app.backends.base`, and translates every upstream failure into
:mod:`app.errors` at one boundary (:func:`upstream_errors` for transport failures,
:func:`error_for_status` for HTTP answers, :func:`error_in_stream` for error objects that
arrive inside a stream).

Error codes raised here:

    upstream_unavailable   the upstream could not be reached (connect failure, HTTP 503)
    upstream_timeout       it was reached but did not answer in time (read timeout, 504)
    upstream_disconnected  the stream broke, or ended before the model finished
    upstream_auth          it refused this server's credentials (401/403); the client is not at fault
    upstream_rejected      it refused the request (other 4xx)                  -> InvalidRequest
    upstream_rate_limited  it is rate limiting (429)                           -> TooManyRequests
    upstream_error         5xx, an error object inside the stream, or a malformed stream

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

``developer`` messages are sent as ``system``: several servers reject the newer role.
Prior reasoning is not replayed unless ``replay_reasoning`` is set (as ``reasoning_content``;
DeepSeek-style APIs reject it in some versions and require it in others).
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from app.backends.base import (
    Backend,
    ChatMessage,
    Delta,
    Finish,
    FinishReason,
    GenerationRequest,
    ModelInfo,
    OutputFormat,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolPolicy,
    ToolSpec,
    Usage,
)
from app.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    ModelError,
    ModelNotFound,
    ORSError,
    TooManyRequests,
)

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=600.0, write=30.0, pool=30.0)
"""Connect fast or fail; a stream may stay silent for minutes while a model thinks."""
DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=4.0)
"""Idle connections are dropped before the 5 s keep-alive timeout of uvicorn- and Node-based servers."""
MODEL_LIST_TTL = 30.0
"""Seconds a fetched upstream model list is reused."""
ERROR_BODY_LIMIT = 64 * 1024
ERROR_MESSAGE_LIMIT = 500

TokenLimitField = Literal["max_tokens", "max_completion_tokens"]
SchemaStyle = Literal["json_schema", "json_object_schema"]

_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}
_CONTEXT_OVERFLOW = re.compile(r"context (length|window)|maximum context|context size|too many tokens", re.I)
_MODEL_MISSING = re.compile(r"model", re.I)
_SSE_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class ChatCompletionsBackend(Backend):
    """Serves models from one OpenAI-compatible upstream.

    ``models``: an optional allow-list. Without it the backend serves every model id (the app
    routes only the ids no local backend claims) and :meth:`fetch_models` reports what the
    upstream lists. ``client``: an injected ``httpx.AsyncClient``, used as is and never closed
    here; otherwise the backend owns one client, opened by :meth:`start` (or on first use) and
    closed by :meth:`aclose`. Its pooled connections belong to the event loop that opened
    them, so one backend serves one loop.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        models: Sequence[str] | None = None,
        client: httpx.AsyncClient | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        limits: httpx.Limits = DEFAULT_LIMITS,
        headers: Mapping[str, str] | None = None,
        token_limit_field: TokenLimitField = "max_tokens",
        schema_style: SchemaStyle = "json_schema",
        replay_reasoning: bool = False,
        owned_by: str = "upstream",
    ) -> None:
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"the upstream base URL must be an http(s) URL, got {base_url!r}")
        self.base_url = str(url).rstrip("/")
        self.allowed_models = tuple(models) if models is not None else None
        self.token_limit_field: TokenLimitField = token_limit_field
        self.schema_style: SchemaStyle = schema_style
        self.replay_reasoning = replay_reasoning
        self.owned_by = owned_by
        self._headers = dict(headers or {})
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = timeout
        self._limits = limits
        self._client = client
        self._owns_client = client is None
        self._model_list: list[ModelInfo] | None = None
        self._model_list_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._http()

    async def aclose(self) -> None:
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout, limits=self._limits, follow_redirects=False)
        return self._client

    # -- models ------------------------------------------------------------------------------

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=name, owned_by=self.owned_by) for name in self.allowed_models or ()]

    def serves(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models

    async def available_models(self) -> list[ModelInfo]:
        return await self.fetch_models()

    async def fetch_models(self) -> list[ModelInfo]:
        """The upstream's ``GET /models``, filtered by the allow-list; best effort.

        A fresh answer is reused for :data:`MODEL_LIST_TTL` seconds. If the upstream cannot
        answer, the last good list (or :meth:`models`) is returned and nothing is raised.
        """
        now = time.monotonic()
        if self._model_list is not None and now - self._model_list_at < MODEL_LIST_TTL:
            return list(self._model_list)
        url = f"{self.base_url}/models"
        try:
            with upstream_errors(url):
                response = await self._http().get(url, headers=self._headers, timeout=10.0)
                if response.status_code != 200:
                    raise error_for_status(response.status_code, response.content, model="", url=url)
            listed = _model_infos(response.json(), self.owned_by)
        except (ORSError, ValueError) as exc:
            logger.warning("could not list the models of the upstream at %s: %s", url, exc)
            return list(self._model_list) if self._model_list is not None else self.models()
        if self.allowed_models is not None:
            listed = [info for info in listed if info.id in self.allowed_models]
        self._model_list, self._model_list_at = listed, now
        return list(listed)

    # -- generation --------------------------------------------------------------------------

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        """Stream one chat completion as normalized deltas, ending with exactly one ``Finish``.

        The upstream response lives inside this generator: closing the generator (``aclose``)
        or cancelling its consumer closes the HTTP response, which drops the connection, and
        servers stop generating for a client that went away. A stream that ends (or breaks)
        before the upstream reported a ``finish_reason`` or sent ``[DONE]`` raises
        ``ModelError`` instead of passing off truncated output as complete.

        One retry, invisible to the consumer: when the connection breaks before the upstream
        sent a single event. That is how a pooled keep-alive connection that the server has
        just closed fails; no output has been seen, so nothing is repeated or lost.
        """
        url = f"{self.base_url}/chat/completions"
        payload = self.payload(request)
        for attempt in (1, 2):
            decoder = ChunkDecoder()
            try:
                async with contextlib.aclosing(self._attempt(url, payload, request.model, decoder)) as deltas:
                    async for delta in deltas:
                        yield delta
            except ModelError as exc:
                if attempt == 1 and exc.code == "upstream_disconnected" and not decoder.received:
                    logger.info("retrying a request whose connection to %s broke before any event", url)
                    continue
                raise
            break
        yield decoder.finish()

    async def _attempt(
        self, url: str, payload: dict[str, Any], model: str, decoder: ChunkDecoder
    ) -> AsyncIterator[Delta]:
        with upstream_errors(url):
            async with self._http().stream("POST", url, json=payload, headers=self._stream_headers()) as response:
                if not 200 <= response.status_code < 300:
                    body = await _read_capped(response, ERROR_BODY_LIMIT)
                    raise error_for_status(response.status_code, body, model=model, url=url)
                if response.headers.get("content-type", "").startswith("application/json"):
                    # A server that ignored ``stream: true`` and sent one whole completion.
                    for delta in decoder.feed_whole(await _read_capped(response, None)):
                        yield delta
                    return
                async with contextlib.aclosing(sse_events(response.aiter_bytes())) as events:
                    async for event, data in events:
                        for delta in decoder.feed_event(event, data):
                            yield delta
                        if decoder.done:
                            return

    def _stream_headers(self) -> dict[str, str]:
        return {**self._headers, "Accept": "text/event-stream"}

    def payload(self, request: GenerationRequest) -> dict[str, Any]:
        """The Chat Completions request body for ``request`` (always streaming)."""
        body: dict[str, Any] = {
            "model": request.model,
            "messages": [self._message(message) for message in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            # Every tool stays visible (a stable prompt prefix); ``allowed`` is enforced downstream.
            body["tools"] = [_tool(spec) for spec in request.tools]
            choice = _tool_choice(request.tool_policy, request.tools)
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
        return body

    def _message(self, message: ChatMessage) -> dict[str, Any]:
        role = "system" if message.role == "developer" else message.role
        out: dict[str, Any] = {"role": role, "content": message.content}
        if role == "assistant":
            if message.tool_calls:
                out["tool_calls"] = [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call in message.tool_calls
                ]
            if self.replay_reasoning and message.reasoning:
                out["reasoning_content"] = message.reasoning
        if role == "tool":
            out["tool_call_id"] = message.tool_call_id or ""
        return out

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
        "name": spec.name,
        "parameters": spec.parameters if spec.parameters is not None else {"type": "object", "properties": {}},
    }
    if spec.description:
        function["description"] = spec.description
    if spec.strict is not None:
        function["strict"] = spec.strict
    return {"type": "function", "function": function}


def _tool_choice(policy: ToolPolicy, tools: Sequence[ToolSpec] = ()) -> str | dict[str, Any] | None:
    """``None`` for plain ``auto``: every server defaults to it, and some reject it spelled out.
    ``required`` with a single candidate is sent as that named function, which more
    servers enforce (llama.cpp's server constrains a named call with a grammar but treats
    ``required`` as a hint)."""
    if policy.mode == "none":
        return "none"
    if policy.mode == "required":
        candidates = policy.allowed if policy.allowed is not None else tuple(tool.name for tool in tools)
        if len(candidates) == 1:
            return {"type": "function", "function": {"name": candidates[0]}}
        return "required"
    return None


# -- stream decoding -------------------------------------------------------------------------


class SSEParser:
    """Incremental Server-Sent Events parser: text in, ``(event, data)`` pairs out.

    Follows the SSE grammar: lines end in CRLF, LF or CR only (unlike ``str.splitlines``,
    which would also split inside JSON carrying U+2028 or U+0085); ``:`` lines are comments
    (keep-alives); several ``data:`` lines join with ``\\n``; a blank line dispatches. Two
    departures: an ``error: {...}`` line (llama.cpp's server) dispatches as event ``error``,
    and data still pending when the stream ends is dispatched rather than dropped, so a
    truncated last line surfaces as a decoding error instead of vanishing.
    """

    def __init__(self) -> None:
        self._partial: list[str] = []
        self._held_cr = False
        self._event = ""
        self._data: list[str] = []

    def feed(self, text: str, *, final: bool = False) -> list[tuple[str, str]]:
        if self._held_cr:
            text, self._held_cr = "\r" + text, False
        if text.endswith("\r") and not final:
            text, self._held_cr = text[:-1], True  # may be the first half of a CRLF
        lines = _SSE_LINE_BREAK.split(text)
        if len(lines) > 1:
            lines[0] = "".join(self._partial) + lines[0]
            self._partial = []
        self._partial.append(lines.pop())
        if final:
            lines.append("".join(self._partial))
            self._partial = []
        events = [event for line in lines if (event := self._line(line)) is not None]
        if final and self._data:
            events.append(self._dispatch())
        return events

    def _line(self, line: str) -> tuple[str, str] | None:
        if not line:
            if self._data:
                return self._dispatch()
            self._event = ""
            return None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "error":
            return "error", value
        return None

    def _dispatch(self) -> tuple[str, str]:
        event = (self._event or "message", "\n".join(self._data))
        self._event, self._data = "", []
        return event


async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[str, str]]:
    """``(event, data)`` pairs from an SSE byte stream, decoded as UTF-8 as SSE requires."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    parser = SSEParser()
    async for chunk in chunks:
        for event in parser.feed(decoder.decode(chunk)):
            yield event
    for event in parser.feed(decoder.decode(b"", final=True), final=True):
        yield event


@dataclass(slots=True)
class _ToolCallState:
    index: int
    upstream_id: str | None
    name: str | None = None
    announced: bool = False
    held_arguments: list[str] = field(default_factory=list)


class ChunkDecoder:
    """Turns Chat Completions chunks (``delta``) or a whole completion (``message``) into deltas.

    Only choice 0 is read. Reasoning arrives as ``reasoning_content`` or ``reasoning``; when a
    server sends both in one delta they carry the same text, so only one is used.

    Tool calls are told apart by the upstream's ``index``; a delta on a known index that
    carries a ``name`` together with a different ``id``, or a different ``name``, starts a new
    call (servers that reuse index 0 for every call), and a delta without ``index`` continues
    the call its ``id`` names, or else the latest call. Calls are renumbered 0, 1, ... in
    order of appearance. A repeated ``name`` on later deltas (llama-cpp-python) is ignored.
    Argument text that arrives before the name is held back, so the first ``ToolCallDelta``
    of every call carries name and ``call_id``; arguments sent as a JSON object (not a
    string) are serialized.
    """

    def __init__(self) -> None:
        self.finish_reason: FinishReason | None = None
        self.usage: Usage | None = None
        self.done = False
        self.received = False
        self._calls: list[_ToolCallState] = []
        self._by_index: dict[int, _ToolCallState] = {}

    def feed_event(self, event: str, data: str) -> list[Delta]:
        """One SSE event: a chunk, ``[DONE]`` (sets :attr:`done`) or an error (raised)."""
        self.received = True
        if event == "error":
            raise error_in_stream(_json_or_text(data))
        if data == "[DONE]":
            self.done = True
            return []
        if not data:
            return []
        chunk = _json_object(data.encode())
        if chunk.get("error"):
            raise error_in_stream(chunk["error"])
        return self.feed(chunk)

    def feed_whole(self, body: bytes) -> list[Delta]:
        """A non-streamed completion (or error object) sent as one JSON body."""
        self.received = True
        whole = _json_object(body)
        if whole.get("error"):
            raise error_in_stream(whole["error"])
        deltas = self.feed(whole)
        self.done = True
        return deltas

    def feed(self, chunk: Mapping[str, Any]) -> list[Delta]:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = _usage(usage)
        deltas: list[Delta] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index") not in (0, None):
                continue
            whole = "message" in choice and "delta" not in choice
            delta = choice.get("message" if whole else "delta") or {}
            if isinstance(delta, dict):
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if isinstance(reasoning, str) and reasoning:
                    deltas.append(ReasoningDelta(reasoning))
                for key in ("content", "refusal"):
                    text = _text(delta.get(key))
                    if text:
                        deltas.append(TextDelta(text))
                for position, call in enumerate(delta.get("tool_calls") or ()):
                    if isinstance(call, dict):
                        deltas.extend(self._tool_call(call, position if whole else None))
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self.finish_reason = _FINISH_REASONS.get(reason, "stop")
        return deltas

    def finish(self) -> Finish:
        """The terminal delta. A ``stop`` after tool calls is reported as ``tool_calls``.

        Raises ``ModelError`` if the stream ended with neither ``[DONE]`` nor a finish reason
        (a cut connection must not pass for a complete answer), or with a nameless tool call.
        """
        if not self.done and self.finish_reason is None:
            raise ModelError(
                "The upstream model server ended the stream before the model finished.",
                code="upstream_disconnected",
            )
        if any(not call.announced for call in self._calls):
            raise ModelError("The upstream sent a tool call without a function name.", code="upstream_error")
        reason = self.finish_reason or "stop"
        if reason == "stop" and self._calls:
            reason = "tool_calls"
        return Finish(reason=reason, usage=self.usage)

    def _tool_call(self, call: Mapping[str, Any], default_index: int | None) -> list[Delta]:
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
        name = function.get("name") if isinstance(function.get("name"), str) and function.get("name") else None
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        elif not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        index = call.get("index") if isinstance(call.get("index"), int) else default_index
        state = self._locate(index, call_id, name)
        if state.name is None and name is not None:
            state.name = name
        if state.upstream_id is None and call_id is not None and not state.announced:
            state.upstream_id = call_id
        if not state.announced:
            if state.name is None:
                state.held_arguments.append(arguments)
                return []
            state.announced = True
            text = "".join(state.held_arguments) + arguments
            state.held_arguments.clear()
            return [ToolCallDelta(index=state.index, name=state.name, arguments=text, call_id=state.upstream_id)]
        return [ToolCallDelta(index=state.index, arguments=arguments)] if arguments else []

    def _locate(self, index: int | None, call_id: str | None, name: str | None) -> _ToolCallState:
        if index is not None:
            known = self._by_index.get(index)
            if known is not None and not (name is not None and self._starts_another_call(known, call_id, name)):
                return known
            state = self._new_call(call_id)
            self._by_index[index] = state
            return state
        if call_id is not None:
            for known in self._calls:
                if known.upstream_id == call_id:
                    return known
            return self._new_call(call_id)
        return self._calls[-1] if self._calls else self._new_call(None)

    @staticmethod
    def _starts_another_call(known: _ToolCallState, call_id: str | None, name: str) -> bool:
        other_id = call_id is not None and known.upstream_id not in (None, call_id)
        other_name = known.name is not None and known.name != name
        return other_id or other_name

    def _new_call(self, call_id: str | None) -> _ToolCallState:
        state = _ToolCallState(index=len(self._calls), upstream_id=call_id)
        self._calls.append(state)
        return state


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        texts = (part.get("text") for part in value if isinstance(part, dict))
        return "".join(text for text in texts if isinstance(text, str))
    return ""


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _usage(raw: Mapping[str, Any]) -> Usage:
    prompt_details = raw.get("prompt_tokens_details") if isinstance(raw.get("prompt_tokens_details"), dict) else {}
    output_details = (
        raw.get("completion_tokens_details") if isinstance(raw.get("completion_tokens_details"), dict) else {}
    )
    return Usage(
        input_tokens=_count(raw.get("prompt_tokens")),
        output_tokens=_count(raw.get("completion_tokens")),
        cached_tokens=_count(prompt_details.get("cached_tokens")),
        reasoning_tokens=_count(output_details.get("reasoning_tokens")),
    )


def _model_infos(listing: Any, owned_by: str) -> list[ModelInfo]:
    entries = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(entries, list):
        raise ValueError("the upstream model list has no 'data' array")
    infos = []
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            window = entry.get("max_model_len")
            infos.append(
                ModelInfo(
                    id=entry["id"],
                    owned_by=entry.get("owned_by") if isinstance(entry.get("owned_by"), str) else owned_by,
                    context_window=window if isinstance(window, int) else None,
                )
            )
    return infos


# -- error translation: the one boundary -------------------------------------------------------


@contextlib.contextmanager
def upstream_errors(url: str) -> Iterator[None]:
    """Translate httpx's transport failures into ``ModelError``; log the upstream's address."""
    try:
        yield
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        logger.warning("cannot reach the upstream at %s: %r", url, exc)
        raise ModelError("The upstream model server is unreachable.", code="upstream_unavailable") from exc
    except httpx.TimeoutException as exc:
        logger.warning("the upstream at %s timed out: %r", url, exc)
        raise ModelError("The upstream model server did not answer in time.", code="upstream_timeout") from exc
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.CloseError) as exc:
        logger.warning("the connection to the upstream at %s broke: %r", url, exc)
        raise ModelError(
            "The connection to the upstream model server broke before the model finished.",
            code="upstream_disconnected",
        ) from exc
    except httpx.HTTPError as exc:
        logger.warning("request to the upstream at %s failed: %r", url, exc)
        raise ModelError("The request to the upstream model server failed.", code="upstream_error") from exc


def error_for_status(status: int, body: bytes, *, model: str, url: str) -> ORSError:
    """The taxonomy error for an upstream HTTP answer that is not a success.

    The upstream's own message reaches the client only where it describes the client's
    request (4xx other than 401/403/429). Otherwise it is logged, not forwarded: auth and
    rate-limit messages can name this server's key or account, and 5xx bodies can carry the
    upstream's tracebacks (llama-cpp-python's server even answers invalid requests with 500).
    """
    message, code = _error_detail(_json_or_text(body.decode("utf-8", errors="replace")))
    detail = message or f"HTTP {status}"
    logger.warning("the upstream at %s answered HTTP %s: %s", url, status, detail)
    if status in (401, 403):
        return ModelError(
            f"The upstream model server refused this server's credentials (HTTP {status}).", code="upstream_auth"
        )
    if status == 429:
        return TooManyRequests("The upstream model server is rate limiting requests.", code="upstream_rate_limited")
    if code == "model_not_found" or (status == 404 and _MODEL_MISSING.search(detail)):
        return ModelNotFound(f"The model {model!r} does not exist upstream: {detail}", param="model")
    if status in (400, 413, 422) and (code == "context_length_exceeded" or _CONTEXT_OVERFLOW.search(detail)):
        return ContextLengthExceeded(f"The upstream model server rejected the input: {detail}")
    if status in (408, 504):
        return ModelError(f"The upstream model server timed out (HTTP {status}).", code="upstream_timeout")
    if status == 503:
        return ModelError("The upstream model server is unavailable (HTTP 503).", code="upstream_unavailable")
    if 400 <= status < 500 and status != 404:
        return InvalidRequest(f"The upstream model server rejected the request: {detail}", code="upstream_rejected")
    return ModelError(f"The upstream model server failed (HTTP {status}).", code="upstream_error")


def error_in_stream(error: Any) -> ModelError:
    """The taxonomy error for an error object the upstream sent instead of (more) chunks."""
    message, _ = _error_detail({"error": error})
    return ModelError(f"The upstream model server failed: {message or 'unknown error'}", code="upstream_error")


def _error_detail(body: Any) -> tuple[str, str | None]:
    """``(message, code)`` from the error shapes servers use: OpenAI's ``{"error": {...}}``,
    ``{"error": "text"}``, FastAPI's ``{"detail": ...}``, ``{"message": ...}`` or plain text."""
    if isinstance(body, dict) and "error" in body:
        body = body["error"]
    code = None
    if isinstance(body, dict):
        code = body.get("code") if isinstance(body.get("code"), str) else None
        body = body.get("message") or body.get("detail") or body.get("msg") or json.dumps(body)
    if isinstance(body, list):
        body = "; ".join(str(item.get("msg", item)) if isinstance(item, dict) else str(item) for item in body)
    text = str(body).strip() if body is not None else ""
    if len(text) > ERROR_MESSAGE_LIMIT:
        text = text[:ERROR_MESSAGE_LIMIT] + "…"
    return text, code


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        snippet = raw[:200].decode("utf-8", errors="replace")
        raise ModelError(f"The upstream model server sent a malformed chunk: {snippet!r}", code="upstream_error")
    return value


async def _read_capped(response: httpx.Response, limit: int | None) -> bytes:
    body = bytearray()
    async for piece in response.aiter_bytes():
        body += piece
        if limit is not None and len(body) >= limit:
            break
    return bytes(body)
