"""Running one response: request → checked context → backend → builder → events.

:meth:`Engine.prepare` does everything that can fail before a stream starts (model
resolution, item checks, context assembly) and raises :class:`app.errors.ORSError`; the
transports turn that into a plain HTTP error or a WebSocket error envelope.

:meth:`Turn.events` then drives the backend and yields numbered events. Its contract:

* The first events are ``response.created`` and ``response.in_progress``; the last is
  exactly one terminal event, whatever fails: a backend error becomes ``error`` +
  ``response.failed``; an unexpected exception becomes a ``server_error`` failure.
* The backend stream is consumed by one pump task that hands deltas over a bounded
  queue; :meth:`Turn.interrupt` puts an error on the same queue, so a shutdown or a
  connection cap ends the turn with ``response.failed`` at once, without per-token cost.
* If the consumer stops iterating (client gone, task cancelled), the pump is cancelled
  and closes the backend stream, which stops generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from app.backends.base import (
    Backend,
    GenerationRequest,
    OutputFormat,
    Sampling,
    ToolPolicy,
    ToolSpec,
)
from app.engine import ids
from app.engine.builder import ResponseBuilder
from app.engine.context import build_messages
from app.engine.echo import initial_response
from app.engine.models import ModelRouter
from app.errors import InvalidRequest, ModelError, ORSError, PreviousResponseNotFound, ServerError
from app.protocol.events import StreamEvent
from app.protocol.items import (
    CompactionParam,
    ExtensionItemParam,
    ItemReferenceParam,
    UserMessageParam,
)
from app.protocol.responses import (
    CreateResponseBody,
    ResponseResource,
    TextFormatJsonObjectParam,
    TextFormatJsonSchemaParam,
)
from app.protocol.tools import AllowedToolsParam, SpecificFunctionParam

log = logging.getLogger("ors.engine")

OWN_EXTENSION_PREFIX = "ors:"
_QUEUE_SIZE = 256
_END = object()


@dataclass(frozen=True, slots=True)
class _Interrupted:
    error: ORSError


@dataclass(slots=True)
class Turn:
    """One response being produced. Iterate :meth:`events` once."""

    body: CreateResponseBody
    backend: Backend
    request: GenerationRequest
    initial: ResponseResource
    error_events: bool = True
    builder: ResponseBuilder = field(init=False)
    error: ORSError | None = field(default=None, init=False)
    _queue: asyncio.Queue[object] | None = field(default=None, init=False, repr=False)
    _pending_interrupt: ORSError | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.builder = ResponseBuilder(self.initial, error_events=self.error_events)

    @property
    def response(self) -> ResponseResource:
        return self.builder.response

    def interrupt(self, error: ORSError) -> None:
        """End the turn early with ``error`` (shutdown, connection cap). Safe to call
        from any task on the loop; the events then end with ``response.failed``."""
        if self._queue is not None:
            self._queue.put_nowait(_Interrupted(error))
        else:
            self._pending_interrupt = error

    async def events(self) -> AsyncIterator[StreamEvent]:
        builder = self.builder
        for event in builder.start():
            yield event
        queue: asyncio.Queue[object] = asyncio.Queue(maxsize=_QUEUE_SIZE)
        self._queue = queue
        if self._pending_interrupt is not None:
            queue.put_nowait(_Interrupted(self._pending_interrupt))
        pump = asyncio.create_task(self._pump(queue), name=f"backend-{self.initial.id}")
        try:
            while not builder.finished:
                got = await queue.get()
                try:
                    if isinstance(got, _Interrupted):
                        raise got.error
                    if isinstance(got, BaseException):
                        raise got
                    if got is _END:
                        raise ModelError("The model stream ended without a finish.", code="model_stream_ended")
                    events = builder.feed(got)  # type: ignore[arg-type]
                except ORSError as exc:
                    self.error = exc
                    log.warning("response %s failed: %r", self.initial.id, exc)
                    events = builder.fail(exc)
                except Exception:
                    log.exception("response %s failed unexpectedly", self.initial.id)
                    self.error = ServerError("The server failed while generating this response.")
                    events = builder.fail(self.error)
                for event in events:
                    yield event
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    async def _pump(self, queue: asyncio.Queue[object]) -> None:
        """Move the backend's deltas into the queue; owns (and always closes) the stream."""
        stream = self.backend.stream(self.request)
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

    async def run(self) -> ResponseResource:
        """Drain the events; the terminal response."""
        async for _ in self.events():
            pass
        return self.builder.response


class Engine:
    """Prepares and runs turns. Transport-agnostic: no HTTP, no WebSocket here."""

    def __init__(self, router: ModelRouter) -> None:
        self.router = router

    def prepare(self, body: CreateResponseBody, *, error_events: bool = True) -> Turn:
        """Check the request and assemble the model's context; raise before any stream."""
        model, backend = self.router.resolve(body.model)
        if body.previous_response_id is not None:
            raise PreviousResponseNotFound(
                f"Previous response with id '{body.previous_response_id}' not found.",
                param="previous_response_id",
            )
        items = _input_items(body)
        messages = build_messages(body.instructions, items)
        if not messages:
            raise InvalidRequest("The request has no input for the model.", code="empty_input", param="input")
        request = GenerationRequest(
            model=model,
            messages=tuple(messages),
            tools=tuple(
                ToolSpec(name=t.name, description=t.description, parameters=t.parameters, strict=t.strict)
                for t in body.tools or []
            ),
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
        initial = initial_response(body, response_id=ids.response_id(), model=model)
        return Turn(body=body, backend=backend, request=request, initial=initial, error_events=error_events)


def _input_items(body: CreateResponseBody) -> Sequence[object]:
    raw = body.input
    if raw is None:
        return []
    if isinstance(raw, str):
        return [UserMessageParam(role="user", content=raw)]
    for index, item in enumerate(raw):
        param = f"input[{index}]"
        if isinstance(item, ExtensionItemParam):
            if item.type.startswith(OWN_EXTENSION_PREFIX):
                raise InvalidRequest(
                    f"Unknown item type '{item.type}': this server defines no such extension item.",
                    code="invalid_type",
                    param=f"{param}.type",
                )
            raise InvalidRequest(
                f"Item type '{item.type}' is another implementation's extension; it is not portable "
                "and this server cannot interpret it. Remove it from the input.",
                code="namespaced",
                param=param,
            )
        if isinstance(item, ItemReferenceParam):
            raise InvalidRequest(
                f"Item '{item.id}' cannot be referenced: no stored item has that id.",
                code="item_not_found",
                param=param,
            )
        if isinstance(item, CompactionParam):
            raise InvalidRequest(
                "Compaction items are not supported by this server yet.",
                code="unsupported_item",
                param=param,
            )
    return raw


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
