"""Running one response: request → checked context → backend → builder → events.

:meth:`Engine.prepare` does everything that can fail before a stream starts (model
resolution, the previous response's history, item checks, the context window) and raises
:class:`app.errors.ORSError`; the transports turn that into a plain HTTP error or a
WebSocket error envelope.

:meth:`Turn.events` then drives the backend and yields :class:`Emitted` events, each
serialized exactly once. Its contract:

* The first events are ``response.created`` and ``response.in_progress`` (a background
  response is ``queued`` first); the last is exactly one terminal event, whatever fails:
  a backend error becomes ``error`` + ``response.failed``; an unexpected exception
  becomes a ``server_error`` failure.
* The backend stream is consumed by one pump task that hands deltas over a bounded
  queue; :meth:`Turn.interrupt` (shutdown, connection cap) and :meth:`Turn.cancel` put
  their request on the same queue, so they take effect at once, at no per-token cost.
* Storage (``store: true``): the response and its input items are recorded before the
  first event is yielded, and its output and events when the terminal event is made.
  Nothing is written per delta.
* If the consumer stops iterating (client gone, task cancelled), the pump is cancelled,
  which closes the backend stream and stops generation; the response is closed
  ``incomplete`` (reason ``client_disconnected``) and that end is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from app.backends.base import Backend, GenerationRequest, OutputFormat, Sampling, ToolPolicy, ToolSpec
from app.engine import ids
from app.engine.builder import ResponseBuilder
from app.engine.compaction import compaction_context
from app.engine.context import build_messages
from app.engine.echo import initial_response
from app.engine.gate import gate
from app.engine.history import History, HistorySource
from app.engine.items import stored_form
from app.engine.models import ModelRouter
from app.engine.sealing import Sealer, SealError
from app.engine.output_format import enforce_output_format
from app.engine.tools import enforce_tool_policy
from app.engine.truncation import fit_context
from app.engine.validation import parse_body
from app.errors import InvalidRequest, ModelError, ORSError, ServerError
from app.protocol.events import StreamEvent
from app.protocol.items import CompactionParam, ExtensionItemParam, ItemReferenceParam, UserMessageParam
from app.protocol.responses import (
    CreateResponseBody,
    ResponseResource,
    TextFormatJsonObjectParam,
    TextFormatJsonSchemaParam,
)
from app.protocol.tools import AllowedToolsParam, SpecificFunctionParam
from app.store.base import NewResponse, ResponseStore

log = logging.getLogger("ors.engine")

OWN_EXTENSION_PREFIX = "ors:"
_QUEUE_SIZE = 256
_END = object()


@dataclass(frozen=True, slots=True)
class Emitted:
    """One event as it leaves the engine: its type and its JSON, made once."""

    type: str
    data: str


@dataclass(frozen=True, slots=True)
class _Interrupted:
    error: ORSError


@dataclass(frozen=True, slots=True)
class _Cancelled:
    pass


class Turn:
    """One response being produced. :meth:`events` may be iterated once; background
    turns are driven by a task and observed with :meth:`follow`."""

    def __init__(
        self,
        *,
        body: CreateResponseBody,
        backend: Backend,
        request: GenerationRequest,
        initial: ResponseResource,
        tenant: str,
        store: ResponseStore | None,
        input_items: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        error_events: bool = True,
        seal_reasoning: Callable[[str], str] | None = None,
    ) -> None:
        self.body = body
        self.backend = backend
        self.request = request
        self.initial = initial
        self.tenant = tenant
        self.store = store
        self.input_items = input_items
        self.tools = tools
        self.builder = ResponseBuilder(initial, error_events=error_events, seal_reasoning=seal_reasoning)
        self.error: ORSError | None = None
        self.emitted: list[Emitted] = []
        self._grew = asyncio.Event()
        self._queue: asyncio.Queue[object] | None = None
        self._pending: object | None = None
        self._recorded_end = False

    @property
    def id(self) -> str:
        return self.initial.id

    @property
    def response(self) -> ResponseResource:
        return self.builder.response

    @property
    def finished(self) -> bool:
        return self.builder.finished

    # ------------------------------------------------------------ control

    def interrupt(self, error: ORSError) -> None:
        """End the turn early with ``error`` (shutdown, connection cap); the events then
        end with ``response.failed``. Safe to call from any task on the loop."""
        self._signal(_Interrupted(error))

    def cancel(self) -> None:
        """Stop at the client's request: the response ends ``cancelled``."""
        self._signal(_Cancelled())

    def _signal(self, message: object) -> None:
        if self._queue is not None:
            self._queue.put_nowait(message)
        else:
            self._pending = message

    # ------------------------------------------------------------ driving

    async def events(self) -> AsyncIterator[Emitted]:
        builder = self.builder
        await self._record_begin()
        for event in builder.start():
            yield self._emit(event)
        if builder.status == "queued":
            for event in builder.begin():
                yield self._emit(event)
            await self._record_status()
        queue: asyncio.Queue[object] = asyncio.Queue(maxsize=_QUEUE_SIZE)
        self._queue = queue
        if self._pending is not None:
            queue.put_nowait(self._pending)
        pump = asyncio.create_task(self._pump(queue), name=f"backend-{self.id}")
        try:
            while not builder.finished:
                batch = [self._emit(event) for event in self._next_events(await queue.get())]
                if builder.finished:
                    # durable before the client sees the end: a client may fetch or
                    # continue the response the moment it reads the terminal event
                    await self._record_end()
                for emitted in batch:
                    yield emitted
        finally:
            pump.cancel()
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
                if not builder.finished:
                    for event in builder.stop("client_disconnected"):
                        self._emit(event)
                await self._record_end()

    def _next_events(self, got: object) -> list[StreamEvent]:
        builder = self.builder
        try:
            if isinstance(got, _Cancelled):
                return builder.cancel()
            if isinstance(got, _Interrupted):
                raise got.error
            if isinstance(got, BaseException):
                raise got
            if got is _END:
                raise ModelError("The model stream ended without a finish.", code="model_stream_ended")
            return builder.feed(got)  # type: ignore[arg-type]
        except ORSError as exc:
            self.error = exc
            log.warning("response %s failed: %r", self.id, exc)
            return builder.fail(exc)
        except Exception:
            log.exception("response %s failed unexpectedly", self.id)
            self.error = ServerError("The server failed while generating this response.")
            return builder.fail(self.error)

    async def _pump(self, queue: asyncio.Queue[object]) -> None:
        """Move the backend's deltas into the queue; owns (and always closes) the stream."""
        stream = enforce_output_format(
            enforce_tool_policy(self.backend.stream(self.request), self.request), self.request
        )
        try:
            async for delta in stream:
                await queue.put(delta)
            await queue.put(_END)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put(exc)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    def _emit(self, event: StreamEvent) -> Emitted:
        emitted = Emitted(event.type, event.model_dump_json())
        self.emitted.append(emitted)
        grew, self._grew = self._grew, asyncio.Event()
        grew.set()
        return emitted

    async def run(self) -> ResponseResource:
        """Drain the events; the terminal response."""
        async for _ in self.events():
            pass
        return self.builder.response

    async def follow(self, starting_after: int | None = None) -> AsyncIterator[Emitted]:
        """The events so far (after sequence number ``starting_after``), then live ones
        until the terminal event. For turns driven by another task (background)."""
        index = 0 if starting_after is None else starting_after + 1
        while True:
            grew = self._grew
            while index < len(self.emitted):
                yield self.emitted[index]
                index += 1
            if self.finished and index >= len(self.emitted):
                return
            await grew.wait()

    # ------------------------------------------------------------ storage

    async def _record_begin(self) -> None:
        if self.store is None:
            return
        resource = self.builder.response
        await self.store.begin(
            NewResponse(
                id=self.id,
                tenant=self.tenant,
                status=resource.status,
                created_at=resource.created_at,
                model=resource.model,
                previous_response_id=resource.previous_response_id,
                instructions=resource.instructions,
                tools=self.tools,
                resource=resource.model_dump(mode="json"),
                input_items=self.input_items,
                background=resource.background,
            )
        )

    async def _record_status(self) -> None:
        if self.store is not None:
            resource = self.builder.response
            await self.store.set_status(self.tenant, self.id, resource.status, resource.model_dump(mode="json"))

    async def _record_end(self) -> None:
        if self.store is None or self._recorded_end or not self.builder.finished:
            return
        self._recorded_end = True
        resource = self.builder.response
        try:
            await self.store.finish(
                self.tenant,
                self.id,
                resource.model_dump(mode="json"),
                [item.model_dump(mode="json") for item in resource.output],
                [emitted.data for emitted in self.emitted],
            )
        except Exception:
            log.exception("could not record the end of response %s", self.id)


class Engine:
    """Prepares and runs turns. Transport-agnostic: no HTTP, no WebSocket here."""

    def __init__(
        self,
        router: ModelRouter,
        store: ResponseStore | None = None,
        sealer: Sealer | None = None,
        *,
        foreign_items: str = "reject",
    ) -> None:
        self.router = router
        self.store = store
        self.sealer = sealer
        self.foreign_items = foreign_items
        """``reject`` (400 ``namespaced``) or ``drop`` (logged) other vendors' items."""

    async def prepare(
        self,
        data: Any,
        *,
        tenant: str,
        history: HistorySource,
        error_events: bool = True,
    ) -> Turn:
        """Check the request (a decoded JSON body) and assemble the model's context; raise
        before any stream.

        Order: the chain of ``previous_response_id`` is loaded, then the replay gate checks
        the input exactly as sent (so its reasons win over generic validation errors),
        then the body is validated into protocol models."""
        if not isinstance(data, dict):
            raise InvalidRequest("The request body must be a JSON object.", code="invalid_type")
        previous = data.get("previous_response_id")
        past = await history.load(previous) if isinstance(previous, str) and previous else History()
        raw_tools = data.get("tools")
        gate(
            data.get("input"),
            history=past.stored_items,
            tools=raw_tools if isinstance(raw_tools, list) else [],
            history_tools=past.tools,
        )
        body = parse_body(CreateResponseBody, data)
        model, backend = self.router.resolve(body.model)
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
        messages = build_messages(body.instructions, [*past.items, *new_items], sealed=sealed)
        if not messages:
            raise InvalidRequest("The request has no input for the model.", code="empty_input", param="input")
        tools = tuple(
            ToolSpec(name=t.name, description=t.description, parameters=t.parameters, strict=t.strict)
            for t in body.tools or []
        )
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
            ),
            output_format=_output_format(body),
            reasoning_effort=body.reasoning.effort if body.reasoning else None,
        )
        await backend.check(request)
        initial = initial_response(
            body, response_id=ids.response_id(), model=model, status="queued" if body.background else "in_progress"
        )
        wants_sealed_reasoning = "reasoning.encrypted_content" in (body.include or [])
        if wants_sealed_reasoning and self.sealer is None:
            raise InvalidRequest("This server cannot encrypt reasoning.", code="unsupported_include",
                                 param="include")
        stores = body.store is not False and self.store is not None
        return Turn(
            body=body,
            backend=backend,
            request=request,
            initial=initial,
            tenant=tenant,
            store=self.store if stores else None,
            input_items=[stored_form(item) for item in new_items],
            tools=[tool.model_dump(mode="json") for tool in initial.tools],
            error_events=error_events,
            seal_reasoning=_reasoning_sealer(self.sealer) if wants_sealed_reasoning else None,
        )


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
    names = {tool.name for tool in body.tools or []}
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
        raise InvalidRequest(
            "tool_choice is 'required' but no tools were given.", code="invalid_value", param="tool_choice"
        )
    return ToolPolicy(mode=mode, parallel=parallel, max_calls=body.max_tool_calls)


def _require_tools(names: set[str], wanted: Sequence[str], param: str) -> None:
    for name in wanted:
        if name not in names:
            raise InvalidRequest(
                f"tool_choice names the function '{name}', which is not in 'tools'.",
                code="invalid_value",
                param=param,
            )


def _output_format(body: CreateResponseBody) -> OutputFormat:
    fmt = body.text.format if body.text else None
    if isinstance(fmt, TextFormatJsonSchemaParam):
        return OutputFormat(kind="json_schema", name=fmt.name, schema=fmt.schema_, strict=fmt.strict)
    if isinstance(fmt, TextFormatJsonObjectParam):
        return OutputFormat(kind="json_object")
    return OutputFormat()
