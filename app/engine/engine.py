"""Preparing and running responses: a decoded request becomes a :class:`Prepared`
request, and a prepared request a :class:`~app.engine.run.Run`.

:meth:`Engine.prepare` does everything that can fail before a stream starts, in this
order, and raises :class:`app.errors.ORSError` (the transports turn that into a plain
HTTP error or a WebSocket error envelope):

1. the chain of ``previous_response_id`` is loaded (tenant-scoped);
2. the replay gate checks the input exactly as sent, so its reasons win over generic
   validation errors;
3. the body is validated into protocol models; the model id is resolved;
4. input items are checked (images, files, extension items, compaction blobs, the place of a
   ``compaction_trigger``, the tools a ``tool_search_output`` loads), the tools are
   sorted into what the model is shown and what a tool search may load
   (:mod:`app.engine.tool_search`), and the context is assembled, then fitted to the
   model's window (``truncation``);
5. the backend checks what it can refuse now (e.g. a schema it cannot enforce).

A compaction turn (a ``compaction_trigger`` ends the input) skips 4's fitting and 5: its
backend is the summariser (:mod:`app.engine.compaction_turn`).

:meth:`Engine.run` then makes the run for a :class:`~app.engine.delivery.Delivery`, and
starts it where its start must be known before the transport commits to a stream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.backends.base import Backend, GenerationRequest, ToolPolicy
from app.engine import ids
from app.engine.assembly import (
    Assembled,
    Opener,
    admit,
    check_compaction,
    generation_request,
    has_schema_work,
    input_items,
    reasoning_sealer,
)
from app.engine.compaction_turn import CompactionTurn, check_compaction_turn, conversation_entries, trigger_index
from app.engine.context import build_messages
from app.engine.conversation_turns import conversation_history, conversation_of, hold, releasing
from app.engine.delivery import Delivery
from app.engine.echo import initial_response
from app.engine.files import FileLimits, check_files
from app.engine.gate import UnknownToolPolicy
from app.engine.history import History, HistoryCache, HistorySource
from app.engine.images import DEFAULT_MAX_IMAGE_BYTES, check_images
from app.engine.items import stored_form
from app.engine.limits import RequestLimits, check_counts
from app.engine.live import LiveRuns
from app.engine.mcp import McpLimits, approvals_of, chain_listings, check_mcp_tools
from app.engine.mcp_loop import Approval, McpSetup
from app.engine.models import ModelRouter
from app.engine.run import Run
from app.engine.sealing import Sealer
from app.engine.tool_search import ToolSearchLimits, ToolSurface, check_choice, check_loaded, tool_surface
from app.engine.truncation import fit_context
from app.engine.validation import parse_body, previous_response_of
from app.errors import InvalidRequest
from app.metrics import Metrics, note_model
from app.protocol.items import CompactionParam
from app.protocol.mcp import McpApprovalResponseParam
from app.protocol.responses import CreateResponseBody, ResponseResource
from app.protocol.states import ResponseStatus
from app.protocol.tools import McpToolChoiceParam, OfferedFunction, UnsupportedToolParam
from app.store.base import ResponseStore

log = logging.getLogger("ors.engine")

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A checked request, ready to run: what the backend is asked for, the response's
    initial snapshot (its id given), and what a stored response records."""

    body: CreateResponseBody
    tenant: str
    backend: Backend
    request: GenerationRequest
    initial: ResponseResource
    store: ResponseStore | None
    """Where the response is recorded; ``None`` when it is not stored."""
    tools: list[JSON]
    """The response's tools in stored form."""
    input_items: Callable[[], list[JSON]]
    """The request's input items in stored form, ids given: made when first asked for,
    then the same list each time (a response neither stored nor continued never needs
    them, and an agent's conversation sent whole is a hundred items or more)."""
    offered: Mapping[str, OfferedFunction]
    """Functions offered under a flat name (namespace and custom tools'), by that name."""
    seal_reasoning: Callable[[str], str] | None
    on_recorded: Callable[[list[JSON]], None] | None
    """Called with the output items (stored form) once the end is recorded."""
    generate: bool = True
    """``False`` for a warm-up (a WebSocket ``generate: false``): the run asks the model
    for nothing but to warm its prompt cache, and completes with no output and zero usage."""
    surface: ToolSurface | None = None
    """The request's tool search, or tools a search loaded earlier in its context;
    ``None`` for a request with neither."""
    conversation: str | None = None
    """The conversation the response is appended to when its end is recorded, held
    until then (:mod:`app.engine.conversation_turns`)."""
    mcp: McpSetup | None = None
    """The request's MCP tools, run by this server (:mod:`app.engine.mcp_loop`)."""

    def whole_request(self) -> GenerationRequest:
        """The request for a response nobody sees before it ends: the backend may make
        it in one piece (``GenerationRequest.incremental`` off)."""
        return dataclasses.replace(self.request, incremental=False)


class Engine:
    """Prepares and runs responses. Transport-agnostic: no HTTP, no WebSocket here."""

    def __init__(
        self,
        router: ModelRouter,
        *,
        store: ResponseStore | None = None,
        sealer: Sealer | None = None,
        history_cache: HistoryCache | None = None,
        metrics: Metrics | None = None,
        live: LiveRuns | None = None,
        foreign_items: str = "reject",
        gate_unknown_tool: UnknownToolPolicy = "accept",
        max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
        file_limits: FileLimits = FileLimits(),
        limits: RequestLimits = RequestLimits(),
        tool_search: ToolSearchLimits = ToolSearchLimits(),
        mcp: McpLimits = McpLimits(),
    ) -> None:
        """Everything the engine works with is given here, and never replaced: the
        response store (``None``: nothing is stored), the sealer of encrypted content
        (``None``: none is made or opened), the cache of recorded conversations, what
        ``/metrics`` counts, and the registry of running responses."""
        self.router = router
        self.store = store
        self.sealer = sealer
        self.history_cache = history_cache
        """Chains of responses recorded here, so a long conversation's next turn does not
        reload it (see :mod:`app.engine.history`)."""
        self.metrics = metrics if metrics is not None else Metrics()
        self.live = live if live is not None else LiveRuns()
        """The stored runs in progress here, and the background ones."""
        self.foreign_items = foreign_items
        """``reject`` (400 ``namespaced``) or ``drop`` (logged) other vendors' items."""
        self.gate_unknown_tool = gate_unknown_tool
        """Whether the replay gate refuses an answer to a call of an undefined tool."""
        self.max_image_bytes = max_image_bytes
        """The largest image a data URL may carry, decoded."""
        self.file_limits = file_limits
        """How much of an attached file is read as text (``ORS_FILE_MAX_*``)."""
        self.limits = limits
        """Depth, items, tools and schema limits of a request (``ORS_MAX_*``)."""
        self.tool_search = tool_search
        """What one server-run tool search may load, and how many one response may make."""
        self.mcp = mcp
        """The MCP servers that may be reached (none: MCP is off), and the calls' budgets."""

    async def _assemble(self, data: Any, history: HistorySource, *, tenant: str,
                        require_input: bool = True) -> Assembled:
        """Steps 1 to 4 of the module's list, up to the context before it is fitted
        (``require_input``: a request that gives the model nothing is a 400)."""
        if not isinstance(data, dict):
            raise InvalidRequest("The request body must be a JSON object.", code="invalid_type")
        check_counts(data, self.limits)
        previous = previous_response_of(data)
        conversation = conversation_of(data)
        if conversation is not None:
            past = await conversation_history(self.store, tenant, conversation)
        else:
            past = await history.load(previous) if previous is not None else History()
        raw_tools = data.get("tools")
        check = functools.partial(
            admit,
            data,
            history=past.stored_items,
            tools=raw_tools if isinstance(raw_tools, list) else [],
            history_tools=past.tools,
            unknown_tool=self.gate_unknown_tool,
            limits=self.limits.schema,
        )
        try:
            if has_schema_work(data, past):
                await asyncio.to_thread(check)  # compiling and validating schemas is CPU work
            else:
                check()
        except InvalidRequest as refused:
            self.metrics.gate_rejections.labels(refused.code or "invalid_request").inc()
            raise
        body = parse_body(CreateResponseBody, data)
        if isinstance(body.input, list):
            check_loaded(body.input)
        trigger = trigger_index(body)
        await check_images(body.input, max_bytes=self.max_image_bytes)
        await check_files(body.input, self.file_limits)
        requested = body.model or self.router.default_model
        model, backend = self.router.resolve(requested)
        note_model(requested)
        mcp_tools = check_mcp_tools(body, self.mcp)
        for index, tool in enumerate(body.tools or []):
            if isinstance(tool, UnsupportedToolParam):
                log.warning("tools[%d] of type %r is not offered to the model: this server cannot run it",
                            index, tool.type)
        if body.background and body.store is False:
            raise InvalidRequest(
                "background responses must be stored: remove store=false or background=true.",
                code="invalid_value",
                param="background",
            )
        new_items = input_items(body, drop_foreign=self.foreign_items == "drop")
        sealed = Opener(self.sealer) if self.sealer is not None else None
        for index, item in enumerate(new_items):
            if isinstance(item, CompactionParam):
                check_compaction(sealed, item, f"input[{index}]")
        paths = {id(item): f"input[{index}]" for index, item in enumerate(body.input)} \
            if isinstance(body.input, list) else None  # where each image and file was sent
        messages = build_messages(body.instructions, new_items, sealed=sealed, start=past.conversation(sealed),
                                  paths=paths)
        if not messages and require_input:
            raise InvalidRequest("The request has no input for the model.", code="empty_input", param="input")
        surface = tool_surface(body, itertools.chain(past.search_outputs(), new_items),
                               hosts_search=backend.hosts_tool_search, limits=self.tool_search,
                               schema_limits=self.limits.schema)
        check_choice(body, surface)
        mcp = None
        if mcp_tools or any(isinstance(item, McpApprovalResponseParam) for item in new_items):
            approvals = approvals_of(past.items, new_items, mcp_tools)
            choice = body.tool_choice
            mcp = McpSetup(tuple(mcp_tools), self.mcp, chain_listings(itertools.chain(past.items, new_items)),
                           tuple(Approval(request, answer.approve, answer.reason) for request, answer in approvals),
                           (choice.server_label, choice.name) if isinstance(choice, McpToolChoiceParam) else None)
        return Assembled(body, requested, model, backend, past, new_items, sealed, messages, surface.tools, trigger,
                         surface, conversation, mcp)

    async def count_input_tokens(self, data: Any, *, tenant: str, history: HistorySource) -> int:
        """``POST /v1/responses/input_tokens``: how many tokens the model would be given
        for this request (instructions, the chain of ``previous_response_id``, the input,
        the tools, rendered by its chat template), counted by its own tokenizer: the
        ``usage.input_tokens`` the same request would report. Checked as :meth:`prepare`
        checks a request; with ``truncation: auto`` the count is of what would be kept, and
        without it a conversation longer than the window is counted all the same. A model
        whose tokens cannot be counted here (an upstream's) is a 400 on ``model``."""
        assembled = await self._assemble(data, history, tenant=tenant)
        if assembled.trigger is not None:
            raise InvalidRequest(
                "A compaction turn (compaction_trigger in the input) gives the model a summarising prompt of "
                "its own, not this request's context: its input tokens are not counted in advance.",
                code="unsupported_item", param=f"input[{assembled.trigger}]")
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

    async def prepare(self, data: Any, *, tenant: str, history: HistorySource, generate: bool = True) -> Prepared:
        """Check the request (a decoded JSON body) and assemble the model's context; raise
        before any stream (the order: the module's list). ``generate=False`` prepares a
        warm-up (:attr:`Prepared.generate`): it may hold no input (its tools alone, say),
        and the backend is not asked to check it, since nothing will be generated."""
        assembled = await self._assemble(data, history, tenant=tenant, require_input=generate)
        body, requested, backend = assembled.body, assembled.requested, assembled.backend
        past, new_items, sealed = assembled.past, assembled.new_items, assembled.sealed
        surface = assembled.surface if assembled.trigger is None else None
        if assembled.trigger is not None:
            backend, request = self._compaction_turn(assembled)
        else:
            messages = await fit_context(backend, assembled.model, assembled.messages, assembled.tools,
                                         truncation=body.truncation or "disabled",
                                         max_output_tokens=body.max_output_tokens)
            request = generation_request(body, assembled.model, messages, assembled.tools, assembled.surface)
        if generate:
            # MCP tools are listed when the run starts: a call required of them is checked then
            await backend.check(request if assembled.mcp is None else dataclasses.replace(
                request, tool_policy=dataclasses.replace(request.tool_policy, mode="auto", allowed=None)))
        initial = initial_response(
            body, response_id=ids.response_id(), model=requested,
            status=ResponseStatus.QUEUED if body.background else ResponseStatus.IN_PROGRESS,
        )
        wants_sealed_reasoning = "reasoning.encrypted_content" in (body.include or [])
        if wants_sealed_reasoning and self.sealer is None:
            raise InvalidRequest("This server cannot encrypt reasoning.", code="unsupported_include",
                                 param="include")
        stores = body.store is not False and self.store is not None
        if assembled.conversation is not None and not stores:
            raise InvalidRequest("A response in a conversation is stored with it: remove store=false.",
                                 code="invalid_value", param="store")
        tools_json = [tool.model_dump(mode="json") for tool in initial.tools]

        stored_inputs: list[JSON] | None = None

        def inputs_stored() -> list[JSON]:  # once, and only if needed (Prepared.input_items)
            # a memo of its own: a functools.cache made per request cost about 1% of one
            nonlocal stored_inputs
            if stored_inputs is None:
                stored_inputs = [stored_form(item) for item in new_items]
            return stored_inputs

        on_recorded = None
        if stores and self.history_cache is not None:
            cache, response_id = self.history_cache, initial.id

            def on_recorded(output: list[JSON]) -> None:
                cache.remember(tenant, response_id, past, tools_json, [*inputs_stored(), *output], sealed=sealed)

        if assembled.conversation is not None:  # the last step: nothing after it may fail
            await hold(self.store, tenant, assembled.conversation, initial.id)
        return Prepared(
            conversation=assembled.conversation,
            body=body,
            tenant=tenant,
            backend=backend,
            request=request,
            initial=initial,
            store=self.store if stores else None,
            tools=tools_json,
            input_items=inputs_stored,
            offered=surface.offered if surface is not None else {},
            seal_reasoning=reasoning_sealer(self.sealer) if wants_sealed_reasoning else None,
            on_recorded=on_recorded,
            generate=generate,
            surface=surface if surface is not None and (surface.searches or surface.late_tools) else None,
            mcp=assembled.mcp if assembled.trigger is None else None,
        )

    def _compaction_turn(self, assembled: Assembled) -> tuple[Backend, GenerationRequest]:
        """The backend and request of a compaction turn (:mod:`app.engine.compaction_turn`):
        the whole conversation, unfitted (the summariser splits what the window cannot
        hold), no tools offered."""
        body, trigger = assembled.body, assembled.trigger
        assert trigger is not None
        check_compaction_turn(body, self.sealer, trigger)
        assert self.sealer is not None
        turn = CompactionTurn(
            assembled.backend, model=assembled.model, sealer=self.sealer,
            entries=conversation_entries(assembled.past.items, assembled.new_items),
            instructions=body.instructions, max_output_tokens=body.max_output_tokens,
        )
        request = GenerationRequest(model=assembled.model, messages=tuple(assembled.messages),
                                    tool_policy=ToolPolicy(mode="none"), cache_key=body.prompt_cache_key)
        return turn, request

    async def run(self, prepared: Prepared, delivery: Delivery, *,
                  on_end: Callable[[], Awaitable[None]] | None = None) -> Run:
        """The run of ``prepared``, delivered as ``delivery`` (``BACKGROUND`` exactly for
        a ``background`` request). A stream's run is started here (its start recorded, if
        it is stored); a background run is handed to a task of its own, and this returns
        once its first event exists. Either raises the start's failure, the run then
        ended; a JSON run starts when it is read. ``on_end`` is awaited once however the
        run ends (:mod:`app.engine.run`), a failed start included."""
        if (delivery is Delivery.BACKGROUND) != bool(prepared.body.background):
            raise ValueError(f"a {'' if prepared.body.background else 'non-'}background request "
                             f"cannot be delivered as {delivery.name}")
        if prepared.conversation is not None and prepared.store is not None:
            on_end = releasing(prepared.store, prepared.tenant, prepared.conversation, prepared.initial.id, on_end)
        run = Run(prepared, delivery, metrics=self.metrics, live=self.live, on_end=on_end)
        if delivery is Delivery.BACKGROUND:
            self.live.start_background(run)
            await run.wait_started()
        elif delivery.streams:
            await run.start()
        return run
