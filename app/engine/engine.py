"""Preparing a response: a decoded request becomes a :class:`~app.engine.turn.Turn`.

:meth:`Engine.prepare` does everything that can fail before a stream starts, in this
order, and raises :class:`app.errors.ORSError` (the transports turn that into a plain
HTTP error or a WebSocket error envelope):

1. the chain of ``previous_response_id`` is loaded (tenant-scoped);
2. the replay gate checks the input exactly as sent, so its reasons win over generic
   validation errors;
3. the body is validated into protocol models; the model id is resolved;
4. input items are checked (images, extension items, compaction blobs) and the context is
   assembled, then fitted to the model's window (``truncation``);
5. the backend checks what it can refuse now (e.g. a schema it cannot enforce).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.backends.base import Backend, ChatMessage, GenerationRequest, OutputFormat, Sampling, ToolPolicy, ToolSpec
from app.engine import ids
from app.engine.compaction import compaction_context
from app.engine.context import build_messages
from app.engine.echo import initial_response
from app.engine.gate import UnknownToolPolicy, gate
from app.engine.history import History, HistoryCache, HistorySource
from app.engine.images import DEFAULT_MAX_IMAGE_BYTES, check_images
from app.engine.items import stored_form
from app.engine.limits import RequestLimits, check_counts
from app.engine.models import ModelRouter
from app.engine.sealing import Sealer, SealError
from app.engine.truncation import fit_context
from app.engine.turn import InFlight, Turn
from app.engine.validation import parse_body
from app.errors import InvalidRequest
from app.metrics import Metrics, note_model
from app.protocol.items import CompactionParam, ExtensionItemParam, ItemReferenceParam, UserMessageParam
from app.protocol.responses import CreateResponseBody, TextFormatJsonObjectParam, TextFormatJsonSchemaParam
from app.protocol.states import ResponseStatus
from app.protocol.tools import AllowedToolsParam, CustomToolParam, SpecificFunctionParam, UnsupportedToolParam
from app.schemas import SchemaLimits, compile_schema
from app.store.base import ResponseStore

log = logging.getLogger("ors.engine")

OWN_EXTENSION_PREFIX = "ors:"


class Engine:
    """Prepares and runs turns. Transport-agnostic: no HTTP, no WebSocket here."""

    def __init__(
        self,
        router: ModelRouter,
        *,
        store: ResponseStore | None = None,
        sealer: Sealer | None = None,
        history_cache: HistoryCache | None = None,
        metrics: Metrics | None = None,
        foreign_items: str = "reject",
        gate_unknown_tool: UnknownToolPolicy = "accept",
        max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
        limits: RequestLimits = RequestLimits(),
    ) -> None:
        """Everything the engine works with is given here, and never replaced: the
        response store (``None``: nothing is stored), the sealer of encrypted content
        (``None``: none is made or opened), the cache of recorded conversations, and
        what ``/metrics`` counts."""
        self.router = router
        self.store = store
        self.sealer = sealer
        self.foreign_items = foreign_items
        """``reject`` (400 ``namespaced``) or ``drop`` (logged) other vendors' items."""
        self.gate_unknown_tool = gate_unknown_tool
        """Whether the replay gate refuses an answer to a call of an undefined tool."""
        self.max_image_bytes = max_image_bytes
        """The largest image a data URL may carry, decoded."""
        self.limits = limits
        """Depth, items, tools and schema limits of a request (``ORS_MAX_*``)."""
        self.metrics = metrics if metrics is not None else Metrics()
        """What the server counts (the one ``/metrics`` reads)."""
        self.in_flight = InFlight()
        """Its turns opened and not yet ended (see :meth:`Turn.open`)."""
        self.history_cache = history_cache
        """Chains of responses recorded here, so a long conversation's next turn does not
        reload it (see :mod:`app.engine.history`)."""

    async def _assemble(self, data: Any, history: HistorySource) -> _Assembled:
        """Steps 1 to 4 of the module's list, up to the context before it is fitted."""
        if not isinstance(data, dict):
            raise InvalidRequest("The request body must be a JSON object.", code="invalid_type")
        check_counts(data, self.limits)
        previous = data.get("previous_response_id")
        past = await history.load(previous) if isinstance(previous, str) and previous else History()
        raw_tools = data.get("tools")
        check = functools.partial(
            _admit,
            data,
            history=past.stored_items,
            tools=raw_tools if isinstance(raw_tools, list) else [],
            history_tools=past.tools,
            unknown_tool=self.gate_unknown_tool,
            limits=self.limits.schema,
        )
        try:
            if _has_schema_work(data, past):
                await asyncio.to_thread(check)  # compiling and validating schemas is CPU work
            else:
                check()
        except InvalidRequest as refused:
            self.metrics.gate_rejections.labels(refused.code or "invalid_request").inc()
            raise
        body = parse_body(CreateResponseBody, data)
        await check_images(body.input, max_bytes=self.max_image_bytes)
        requested = body.model or self.router.default_model
        model, backend = self.router.resolve(requested)
        note_model(requested)
        for index, tool in enumerate(body.tools or []):
            if isinstance(tool, UnsupportedToolParam) or (isinstance(tool, CustomToolParam) and not tool.offerable):
                log.warning("tools[%d] of type %r is not offered to the model: this server cannot run it",
                            index, tool.type)
        if body.background and body.store is False:
            raise InvalidRequest(
                "background responses must be stored: remove store=false or background=true.",
                code="invalid_value",
                param="background",
            )
        new_items = _input_items(body, drop_foreign=self.foreign_items == "drop")
        sealed = _Opener(self.sealer) if self.sealer is not None else None
        for index, item in enumerate(new_items):
            if isinstance(item, CompactionParam):
                _check_compaction(sealed, item, f"input[{index}]")
        messages = build_messages(body.instructions, new_items, sealed=sealed, start=past.conversation(sealed))
        if not messages:
            raise InvalidRequest("The request has no input for the model.", code="empty_input", param="input")
        tools = tuple(
            ToolSpec(name=f.name, description=f.description, parameters=f.parameters, strict=f.strict)
            for f in body.function_tools
        )
        return _Assembled(body, requested, model, backend, past, new_items, sealed, messages, tools)

    async def count_input_tokens(self, data: Any, *, history: HistorySource) -> int:
        """``POST /v1/responses/input_tokens``: how many tokens the model would be given
        for this request (instructions, the chain of ``previous_response_id``, the input,
        the tools, rendered by its chat template), counted by its own tokenizer: the
        ``usage.input_tokens`` the same request would report. Checked as :meth:`prepare`
        checks a request; with ``truncation: auto`` the count is of what would be kept, and
        without it a conversation longer than the window is counted all the same. A model
        whose tokens cannot be counted here (an upstream's) is a 400 on ``model``."""
        assembled = await self._assemble(data, history)
        messages = assembled.messages
        if assembled.body.truncation == "auto":
            messages = await fit_context(assembled.backend, assembled.model, messages, assembled.tools,
                                         truncation="auto", max_output_tokens=assembled.body.max_output_tokens)
        counted = await assembled.backend.count_tokens(assembled.model, messages, assembled.tools)
        if counted is None:
            raise InvalidRequest(
                f"Tokens can be counted for this server's embedded models only: the model "
                f"'{assembled.requested}' runs upstream, with a tokenizer this server does not have.",
                code="unsupported_model", param="model")
        return counted

    async def prepare(
        self,
        data: Any,
        *,
        tenant: str,
        history: HistorySource,
        error_events: bool = True,
        whole_unless_streamed: bool = False,
    ) -> Turn:
        """Check the request (a decoded JSON body) and assemble the model's context; raise
        before any stream. ``whole_unless_streamed``: a request that neither streams nor
        runs in the background is answered as one document (a plain JSON answer over
        HTTP), so nobody sees its output before it ends, and the backend may make it in
        one piece (``GenerationRequest.incremental`` off).

        Order: the chain of ``previous_response_id`` is loaded, then the replay gate checks
        the input exactly as sent (so its reasons win over generic validation errors),
        then the body is validated into protocol models."""
        assembled = await self._assemble(data, history)
        body, requested, model, backend = assembled.body, assembled.requested, assembled.model, assembled.backend
        past, new_items, sealed, messages, tools = (assembled.past, assembled.new_items, assembled.sealed,
                                                    assembled.messages, assembled.tools)
        messages = await fit_context(
            backend,
            model,
            messages,
            tools,
            truncation=body.truncation or "disabled",
            max_output_tokens=body.max_output_tokens,
        )
        request = GenerationRequest(
            model=model,
            messages=tuple(messages),
            tools=tools,
            tool_policy=_tool_policy(body),
            sampling=Sampling(
                temperature=body.temperature,
                top_p=body.top_p,
                max_output_tokens=body.max_output_tokens,
                presence_penalty=body.presence_penalty,
                frequency_penalty=body.frequency_penalty,
                top_logprobs=body.top_logprobs,
                logprobs="message.output_text.logprobs" in (body.include or []) or bool(body.top_logprobs),
            ),
            output_format=_output_format(body),
            reasoning_effort=body.reasoning.effort if body.reasoning else None,
            cache_key=body.prompt_cache_key,
            incremental=not whole_unless_streamed or bool(body.stream or body.background),
        )
        await backend.check(request)
        initial = initial_response(
            body, response_id=ids.response_id(), model=requested,
            status=ResponseStatus.QUEUED if body.background else ResponseStatus.IN_PROGRESS,
        )
        wants_sealed_reasoning = "reasoning.encrypted_content" in (body.include or [])
        if wants_sealed_reasoning and self.sealer is None:
            raise InvalidRequest("This server cannot encrypt reasoning.", code="unsupported_include",
                                 param="include")
        stores = body.store is not False and self.store is not None
        tools_json = [tool.model_dump(mode="json") for tool in initial.tools]

        stored_inputs: list[dict[str, Any]] | None = None

        def inputs_stored() -> list[dict[str, Any]]:  # once, and only if needed (Turn.input_items)
            # a memo of its own: a functools.cache made per request cost about 1% of one
            nonlocal stored_inputs
            if stored_inputs is None:
                stored_inputs = [stored_form(item) for item in new_items]
            return stored_inputs

        on_recorded = None
        if stores and self.history_cache is not None:
            cache, response_id = self.history_cache, initial.id

            def on_recorded(output: list[dict[str, Any]]) -> None:
                cache.remember(tenant, response_id, past, tools_json, [*inputs_stored(), *output], sealed=sealed)

        return Turn(
            body=body,
            backend=backend,
            request=request,
            initial=initial,
            tenant=tenant,
            store=self.store if stores else None,
            input_items=inputs_stored,
            tools=tools_json,
            error_events=error_events,
            seal_reasoning=_reasoning_sealer(self.sealer) if wants_sealed_reasoning else None,
            metrics=self.metrics,
            on_recorded=on_recorded,
            in_flight=self.in_flight,
        )


@dataclass(frozen=True, slots=True)
class _Assembled:
    """A checked request and the model's context, not yet fitted to its window."""

    body: CreateResponseBody
    requested: str
    """The model id as asked for (an alias stays an alias)."""
    model: str
    backend: Backend
    past: History
    new_items: list[Any]
    sealed: _Opener | None
    messages: list[ChatMessage]
    tools: tuple[ToolSpec, ...]


class _Opener:
    """Sealed content as the context builder needs it."""

    def __init__(self, sealer: Sealer) -> None:
        self.sealer = sealer

    def compaction_text(self, encrypted_content: str) -> str:
        return compaction_context(self.sealer, encrypted_content)

    def reasoning_text(self, encrypted_content: str) -> str | None:
        try:
            text = self.sealer.unseal("reasoning", encrypted_content).get("text")
        except SealError:
            return None
        return text if isinstance(text, str) else None


def _check_compaction(sealed: _Opener | None, item: CompactionParam, param: str) -> None:
    if sealed is None:
        raise InvalidRequest("This server cannot open compaction items.", code="unsupported_item", param=param)
    try:
        sealed.compaction_text(item.encrypted_content)
    except SealError as error:
        error.param = param
        raise


def _reasoning_sealer(sealer: Sealer | None) -> Callable[[str], str]:
    assert sealer is not None
    return lambda text: sealer.seal("reasoning", {"text": text})


def _input_items(body: CreateResponseBody, *, drop_foreign: bool) -> Sequence[object]:
    raw = body.input
    if raw is None:
        return []
    if isinstance(raw, str):
        return [UserMessageParam(role="user", content=raw)]
    kept: list[object] = []
    for index, item in enumerate(raw):
        param = f"input[{index}]"
        if isinstance(item, ExtensionItemParam):
            if item.type.startswith(OWN_EXTENSION_PREFIX):
                raise InvalidRequest(
                    f"Unknown item type '{item.type}': this server defines no such extension item.",
                    code="invalid_type",
                    param=f"{param}.type",
                )
            if drop_foreign:
                log.warning("dropped %s of type %r: another implementation's extension item", param, item.type)
                continue
            raise InvalidRequest(
                f"Item type '{item.type}' is another implementation's extension; it is not portable "
                "and this server cannot interpret it. Remove it from the input.",
                code="namespaced",
                param=param,
            )
        if isinstance(item, ItemReferenceParam):
            raise InvalidRequest(
                f"Item '{item.id}' cannot be referenced: item references are not supported; "
                "send the item itself or continue with previous_response_id.",
                code="unsupported_item",
                param=param,
            )
        kept.append(item)
    return kept


def _tool_policy(body: CreateResponseBody) -> ToolPolicy:
    names = {tool.name for tool in body.function_tools}
    choice = body.tool_choice
    parallel = True if body.parallel_tool_calls is None else body.parallel_tool_calls
    if isinstance(choice, SpecificFunctionParam):
        _require_tools(names, [choice.name], "tool_choice.name")
        return ToolPolicy(mode="required", allowed=(choice.name,), parallel=parallel, max_calls=body.max_tool_calls)
    if isinstance(choice, AllowedToolsParam):
        allowed = tuple(tool.name for tool in choice.tools)
        _require_tools(names, allowed, "tool_choice.tools")
        return ToolPolicy(mode=choice.mode, allowed=allowed, parallel=parallel, max_calls=body.max_tool_calls)
    mode = choice or "auto"
    if mode == "required" and not names:
        given = [f"'{tool.type}'" for tool in body.tools or ()]
        reason = (f"none of the tools given ({', '.join(given)}) can be offered to the model: this server runs "
                  "function tools, namespace tools and custom tools without a lark grammar") if given else \
            "no tools were given"
        raise InvalidRequest(f"tool_choice is 'required' but {reason}.", code="invalid_value", param="tool_choice")
    if mode == "auto" and parallel and body.max_tool_calls is None:
        return _AUTO
    return ToolPolicy(mode=mode, parallel=parallel, max_calls=body.max_tool_calls)


def _require_tools(names: set[str], wanted: Sequence[str], param: str) -> None:
    for name in wanted:
        if name not in names:
            raise InvalidRequest(
                f"tool_choice names the function '{name}', which is not in 'tools'.",
                code="invalid_value",
                param=param,
            )


def _admit(
    data: dict[str, Any],
    *,
    history: Sequence[Any],
    tools: list[Any],
    history_tools: Sequence[Any],
    unknown_tool: UnknownToolPolicy,
    limits: SchemaLimits,
) -> None:
    """The replay gate (which compiles the tools' schemas), then ``text.format.schema``:
    every schema of the request goes through :mod:`app.schemas` before anything uses it."""
    gate(data.get("input"), history=history, tools=tools, history_tools=history_tools,
         unknown_tool=unknown_tool, schema_limits=limits)
    text = data.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and "schema" in fmt:
        problem = compile_schema(fmt["schema"], limits).problem
        if problem is not None:
            raise InvalidRequest(
                f"text.format.schema cannot be used as a JSON Schema (Draft 2020-12): {problem}.",
                code="invalid_json_schema",
                param="text.format.schema",
            )


_INLINE_ITEMS = 64
"""Above this many input items, even a gate without schemas walks them in a worker thread."""


def _has_schema_work(data: dict[str, Any], past: History) -> bool:
    """Whether admitting the request compiles or validates against a schema (tools, a
    ``json_schema`` text format, or outputs answering calls of the chain's tools)."""
    if data.get("tools") or past.tools:
        return True
    items = data.get("input")
    if isinstance(items, list) and len(items) > _INLINE_ITEMS:
        return True
    text = data.get("text")
    return isinstance(text, dict) and isinstance(text.get("format"), dict)


def _output_format(body: CreateResponseBody) -> OutputFormat:
    fmt = body.text.format if body.text else None
    if isinstance(fmt, TextFormatJsonSchemaParam):
        return OutputFormat(kind="json_schema", name=fmt.name, schema=fmt.schema_, strict=fmt.strict)
    if isinstance(fmt, TextFormatJsonObjectParam):
        return _JSON_OBJECT
    return _FREE_TEXT


_FREE_TEXT, _JSON_OBJECT = OutputFormat(), OutputFormat(kind="json_object")
_AUTO = ToolPolicy()
"""What most requests ask for, made once (frozen, so shared by every request that does)."""
