"""The embedded model backend: GGUF models served by llama.cpp's own server.

Each model has two halves:

* in this process, its vocabulary and chat template (:mod:`app.backends.vocabulary`,
  no weights): prompts are rendered and tokenized here, token counts for truncation come
  from here, and grammars are checked against the vocabulary before a response starts;
* in a child process, ``llama-server`` (``llama_server``), which holds the weights and the
  KV cache and does the generating: continuous batching over ``parallel`` slots, chunked
  prompt evaluation interleaved with decoding, and a prefix cache that outlives requests.

Requests, the contract in full:

* A model is started lazily (or in ``start()``); concurrent first requests share one start.
* Each generation holds one place in the model's :class:`~app.backends.slots.SlotPool`
  (as many as llama-server has slots) from the moment it is sent until its stream ends, so
  llama-server always has a free slot for what it is sent and never queues work out of
  sight. More requests than slots wait in FIFO order, at most ``queue`` of them; beyond
  that, ``429 too_many_requests``.
* Which slot, and which cached prefix, is llama-server's own choice: a request is not
  pinned to a slot (``id_slot``). llama-server takes an idle slot whose prompt shares
  enough of the new one, else the least recently used slot, which first loads the
  longest matching prefix from the host-memory cache, where every idle slot's state
  goes when a request starts (``--cache-idle-slots``, its default with a unified KV
  cache). A pinned request skips that lookup when its slot is empty, which it almost
  always is (llama.cpp issue 28139), so pinning lost the cache of every request that
  started beside another. ``prompt_cache_key`` therefore changes nothing here: the cache
  is found by the prompt's content.
* The prompt is sent as token ids (tokenized once here, with special tokens parsed), with
  ``cache_prompt``: the shared prefix is not evaluated again, and ``cached_tokens`` in the
  usage is llama-server's own count of reused tokens.
* A warm-up (:meth:`LocalBackend.warm`, a WebSocket ``generate: false``) evaluates a prompt
  into the cache in the background, in a slot of its own; a generation whose prompt begins
  with it waits for it, then reuses it (:mod:`app.backends.warm_ups`).
* Closing the stream (client gone, cancel, shutdown) closes the HTTP response; llama-server
  stops that generation at its next token and the slot is released at once.
* At ``aclose()`` every slot's KV state is saved under ``ORS_DATA_DIR/kv/<model>/`` and at
  the next start restored, so a prefix cached before a restart is still cached after it.
* A llama-server that exits on its own is started again by its supervisor
  (:class:`~app.backends.llama_server.LlamaServer`): the streams it ran fail, requests
  that arrive meanwhile wait for it, and the saved slots are restored again.

Tools: every tool of the request is rendered into the prompt whatever the tool policy
(``prompting``); the default output parser turns the model's written calls into
``ToolCallDelta``s and enforces the policy, and a grammar (sent with the request, applied
per sequence by llama-server) forces a call when one is required (``toolcalls``), and
under ``auto`` holds a call the model opens with its tag token (lazily, ``grammar``). What
one generation asks of llama-server, and how its chunks become deltas, logprobs and
usage, is :mod:`app.backends.local_completion`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from pathlib import Path

from app.backends.base import (
    Backend,
    ChatMessage,
    Delta,
    Finish,
    GenerationRequest,
    ModelGauges,
    ModelInfo,
    ToolSpec,
    Usage,
)
from app.backends.llama_process import DEFAULT_CHUNK
from app.backends.llama_server import HANG_SECONDS, ServerState
from app.backends.local_completion import (
    CompletionReader,
    OutputParserFactory,
    Plan,
    completion_body,
    make_plan,
)
from app.backends.local_model import LocalModel, ServedModel
from app.backends.model_files import LOCAL_MODELS, ModelFiles, ModelSpec
from app.backends.model_starter import ModelStarter
from app.backends.residency import Residency
from app.backends.slots import SlotPool
from app.backends.toolcalls import tool_call_parser
from app.backends.warm_ups import WarmUps
from app.errors import (
    Conflict,
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    ORSError,
)

log = logging.getLogger("ors.local")


DEFAULT_PARALLEL = 4
DEFAULT_QUEUE = 32
DEFAULT_CACHE_RAM_MIB = 2048
HOLDS_LARK_GRAMMARS = True
"""Whether a forced call of a ``custom`` tool with a Lark grammar (Codex's freeform
``apply_patch``) is held to that grammar here (:mod:`app.backends.lark_gbnf`): the
models are then listed with ``lark_grammars``, and Codex's catalog offers them freeform
``apply_patch``."""

class LocalBackend(Backend):
    """Serves the embedded models (the built-in ``model_files.LOCAL_MODELS`` and the
    operator's, :mod:`app.models_config`) with llama-server."""

    def __init__(
        self,
        cache_dir: Path,
        *,
        n_threads: int | None = None,
        n_ctx: int | None = None,
        preload: Sequence[str] = (),
        models: Sequence[str] | None = None,
        output_parser: OutputParserFactory = tool_call_parser,
        parallel: int = DEFAULT_PARALLEL,
        queue: int = DEFAULT_QUEUE,
        cache_ram_mib: int = DEFAULT_CACHE_RAM_MIB,
        kv_type: str = "f16",
        chunk: int = DEFAULT_CHUNK,
        server_binary: str | None = None,
        hang_seconds: float = HANG_SECONDS,
        temperature: float | None = None,
        extra_models: Mapping[str, ModelSpec] | None = None,
        memory_mib: int | None = None,
        idle_seconds: float = 0,
    ) -> None:
        """Configure; nothing is started before ``start()`` or first use.

        ``cache_dir`` is the server's data directory (assembled model files, saved KV
        state, llama-server logs); ``n_threads`` defaults to the CPUs this process may run
        on; ``n_ctx`` overrides each model's context window (the KV cache its slots
        share); ``preload`` lists models to start in ``start()``; ``models`` limits the
        served ids (default: all of ``LOCAL_MODELS``); ``output_parser`` makes the parser
        of each generation's text; ``parallel`` slots per model, ``queue`` requests may wait
        for one; ``cache_ram_mib`` of host memory keep idle slots' prompt caches;
        ``kv_type`` is the KV cache's type (``f16``, ``q8_0``); ``chunk`` the prompt
        tokens evaluated per step beside running streams; ``server_binary`` the
        llama-server executable (default: the installed one); ``hang_seconds`` how long a
        running llama-server may answer nothing before it is killed and started again
        (0: never); ``temperature`` replaces each model's own default temperature;
        ``extra_models`` are the operator's, served beside those of ``models``;
        ``memory_mib`` bounds what the loaded models may take together, and a model
        unused for ``idle_seconds`` (0: never) is unloaded (:mod:`app.backends.residency`).
        """
        catalog = {**LOCAL_MODELS, **(extra_models or {})}
        served = [*(LOCAL_MODELS if models is None else models), *(extra_models or {})]
        unknown = [m for m in [*served, *preload] if m not in catalog]
        if unknown:
            raise ValueError(f"Unknown local models: {', '.join(unknown)}; known: {', '.join(catalog)}")
        self._starter = ModelStarter(Path(cache_dir), ModelFiles(cache_dir, catalog), threads=n_threads,
                                     parallel=parallel, queue=queue, cache_ram_mib=cache_ram_mib, kv_type=kv_type,
                                     chunk=chunk, server_binary=server_binary, hang_seconds=hang_seconds)
        self._n_ctx = n_ctx
        self._preload = list(preload)
        self._output_parser = output_parser
        specs = {model: spec.with_temperature(temperature) for model, spec in catalog.items()}
        self._entries = {model: ServedModel(specs[model]) for model in served}
        for model in self._preload:
            self._entries.setdefault(model, ServedModel(specs[model]))
        self._warm_ups = WarmUps()
        self._residency = Residency(self._entries.values(), self._load, memory_mib=memory_mib,
                                    idle_seconds=idle_seconds)

    def models(self) -> list[ModelInfo]:
        return [self._info(model) for model in self._entries]

    def _info(self, model: str) -> ModelInfo:
        return ModelInfo(id=model, owned_by="ors", context_window=self.context_window(model), images=False,
                         lark_grammars=HOLDS_LARK_GRAMMARS, status=self._entry(model).status.value)

    async def load(self, model: str) -> ModelInfo:
        """Load ``model`` now (as its first request would), and say how it stands."""
        async with self._residency.lease(self._entry(model)):
            pass
        return self._info(model)

    async def unload(self, model: str) -> ModelInfo:
        """Unload ``model`` now (its slots saved); 409 ``model_busy`` while it serves."""
        entry = self._entry(model)
        if entry.loading is not None:
            with contextlib.suppress(ORSError):
                await asyncio.shield(entry.loading)
        if entry.model is not None:
            if not entry.idle:
                raise Conflict(f"The model '{model}' is serving {entry.holders} request(s); unload it when it is idle",
                               code="model_busy", param="model")
            await self._residency.unload(entry)
        return self._info(model)

    def serves(self, model: str) -> bool:
        return model in self._entries

    def gauges(self) -> list[ModelGauges]:
        return [
            ModelGauges(model, entry.model.slots.size, entry.model.slots.busy, entry.model.slots.waiting,
                        up=entry.model.server.state is ServerState.RUNNING, restarts=entry.model.server.restarts,
                        memory_mib=entry.reserved_mib)
            for model, entry in self._entries.items()
            if entry.model is not None
        ]

    def context_window(self, model: str) -> int:
        """Tokens of context (prompt plus output) that ``model`` runs with."""
        spec = self._entry(model).spec
        return spec.context_window if spec.context_configured else self._n_ctx or spec.context_window

    def slot_pool(self, model: str) -> SlotPool | None:
        """The slots of ``model`` once it runs (for the queue and slot gauges)."""
        entry = self._entry(model)
        return entry.model.slots if entry.model is not None else None

    def server_url(self, model: str) -> str | None:
        """The loopback URL of ``model``'s llama-server once it runs."""
        entry = self._entry(model)
        return entry.model.server.base_url if entry.model is not None else None

    def server_headers(self, model: str) -> dict[str, str]:
        """What a request to ``model``'s llama-server must carry (its key), once it runs."""
        entry = self._entry(model)
        return entry.model.server.headers if entry.model is not None else {}

    async def start(self) -> None:
        self._residency.start()
        for model in self._preload:
            await self.load(model)

    async def aclose(self) -> None:
        """Stop every model's server, saving its slots' prompt caches first."""
        await self._residency.close()
        await self._warm_ups.close()
        for entry in self._entries.values():
            if entry.loading is not None:
                with contextlib.suppress(ORSError):
                    await asyncio.shield(entry.loading)
            if entry.model is not None:
                await entry.model.close()
            entry.model, entry.loading = None, None

    async def count_tokens(self, model: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()) -> int:
        """Prompt tokens of ``messages`` (and ``tools``) rendered with the model's template."""
        async with self._residency.lease(self._entry(model)) as loaded:
            return len(await asyncio.to_thread(loaded.vocabulary.prompt_tokens, tuple(messages), tuple(tools)))

    async def check(self, request: GenerationRequest) -> None:
        """Schemas that cannot become a grammar are refused before the response starts,
        and so is a request that would find the model's queue full (429)."""
        async with self._residency.lease(self._entry(request.model)) as loaded:
            if loaded.chat is not None:  # its server makes the grammars, and refuses what it cannot
                loaded.slots.check()
                return
            plan = await self._planned(request, loaded)
            if plan.grammar is not None and not await asyncio.to_thread(loaded.vocabulary.accepts_grammar,
                                                                        plan.grammar):
                raise InvalidRequest(
                    "The local model cannot enforce this schema: llama.cpp rejected the grammar made from it",
                    param=plan.grammar_source,
                )
            loaded.slots.check()

    async def warm(self, request: GenerationRequest) -> None:
        """Evaluate the request's prompt into the prompt cache in the background
        (:mod:`app.backends.warm_ups`); the next generation that begins with it waits
        for it, then finds it cached."""
        entry = self._entries.get(request.model)
        if entry is None or not request.messages or entry.spec.chat_parser != "ors":
            return  # a server that renders its own chats caches what it rendered

        async def prompt() -> list[int]:
            async with self._residency.lease(entry) as loaded:
                return await asyncio.to_thread(loaded.vocabulary.prompt_tokens, request.messages, request.tools)

        async def evaluate(tokens: list[int]) -> None:
            async with self._residency.lease(entry) as loaded:
                if len(tokens) >= loaded.context_window:
                    return
                slot = loaded.slots.try_acquire()
                if slot is None:
                    log.info("warm-up of %s skipped: every slot is busy", entry.spec.id)
                    return
                try:
                    body = {"prompt": tokens, "n_predict": 0, "cache_prompt": True}
                    async with contextlib.aclosing(loaded.server.complete(body)) as chunks:
                        async for _ in chunks:
                            pass
                finally:
                    loaded.slots.release(slot)

        self._warm_ups.start(request.model, prompt, evaluate)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        entry = self._entry(request.model)
        async with self._residency.lease(entry) as loaded:
            generation = self._chat(request, loaded) if loaded.chat is not None else self._generate(request, entry,
                                                                                                  loaded)
            async with contextlib.aclosing(generation) as deltas:
                async for delta in deltas:
                    yield delta

    async def _chat(self, request: GenerationRequest, loaded: LocalModel) -> AsyncGenerator[Delta, None]:
        """A generation by the model's server's own chat endpoint: its template, its
        parsers of the model family's calls and reasoning (``ModelSpec.chat_parser``)."""
        slot = await loaded.slots.acquire()
        try:
            async with contextlib.aclosing(loaded.chat_endpoint().stream(request)) as deltas:
                async for delta in deltas:
                    yield delta
        finally:
            loaded.slots.release(slot)

    async def _generate(self, request: GenerationRequest, entry: ServedModel,
                        loaded: LocalModel) -> AsyncGenerator[Delta, None]:
        plan = await self._planned(request, loaded)
        tokens = await asyncio.to_thread(loaded.vocabulary.prompt_tokens, plan.messages, plan.tools)
        window = loaded.context_window
        if len(tokens) >= window:
            raise ContextLengthExceeded(
                f"The input takes {len(tokens)} tokens, but model '{entry.spec.id}' has a context "
                f"window of {window} tokens for input and output together.",
                param="input",
            )
        budget = window - len(tokens)
        max_tokens = budget if plan.max_tokens is None else min(plan.max_tokens, budget)
        if max_tokens <= 0:
            yield Finish("length", Usage(input_tokens=len(tokens)))
            return
        reader = CompletionReader(self._output_parser(request, entry.spec), plan)
        await self._warm_ups.settled(request.model, tokens)
        slot = await loaded.slots.acquire()
        try:
            async with contextlib.aclosing(loaded.server.complete(completion_body(plan, tokens, max_tokens))) as chunks:
                async for chunk in chunks:
                    for delta in reader.feed(chunk):
                        yield delta
            yield reader.finish(len(tokens))
        finally:
            loaded.slots.release(slot)

    def _entry(self, model: str) -> ServedModel:
        try:
            return self._entries[model]
        except KeyError:
            raise ModelNotFound(f"The model '{model}' does not exist", param="model") from None

    async def _planned(self, request: GenerationRequest, model: LocalModel) -> Plan:
        """The request's :func:`~app.backends.local_completion.make_plan`, in a worker thread
        when it converts a schema into a grammar (CPU work that grows with the schema),
        inline otherwise."""
        if request.tools or request.late_tools or request.output_format.kind != "text":
            return await asyncio.to_thread(make_plan, request, model.spec, model.vocabulary)
        return make_plan(request, model.spec, model.vocabulary)

    async def _load(self, entry: ServedModel) -> LocalModel:
        return await self._starter.start(entry, self.context_window(entry.spec.id), self._residency.admit)
