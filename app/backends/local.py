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
per sequence by llama-server) forces a call when one is required (``toolcalls``).

Logprobs (``sampling.logprobs``): llama-server's ``n_probs``: the log-softmax of the
model's own distribution at each position, before sampling. Tokens are attributed to the
parser's emitted ``TextDelta``s by a ``LogprobLedger`` (``logprob_ledger``): exact where
the text passes through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from app.backends.base import (
    Backend,
    ChatMessage,
    Delta,
    Finish,
    FinishReason,
    GenerationRequest,
    ModelGauges,
    ModelInfo,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from app.backends.llama_process import DEFAULT_CHUNK, ServerOptions, find_binary
from app.backends.llama_server import HANG_SECONDS, LlamaServer, ServerState
from app.backends.logprob_ledger import LogprobLedger
from app.backends.model_files import LOCAL_MODELS, ModelFiles, ModelSpec
from app.backends.prompting import output_grammar, unicode_text
from app.backends.slots import SlotPool
from app.backends.toolcalls import tool_call_grammar, tool_call_parser
from app.backends.vocabulary import Vocabulary
from app.errors import ContextLengthExceeded, InvalidRequest, ModelError, ModelNotFound, ORSError

log = logging.getLogger("ors.local")


DEFAULT_PARALLEL = 4
DEFAULT_QUEUE = 32
DEFAULT_CACHE_RAM_MIB = 2048

_STOP_REASONS: dict[str, FinishReason] = {"limit": "length", "eos": "stop", "word": "stop"}


class OutputParser(Protocol):
    """Turns the model's raw text into deltas; one instance per generation.

    ``feed`` receives text as it is generated; ``close`` is called once at the end and
    returns whatever was held back. A parser that yields ``ToolCallDelta``s makes a normal
    stop finish with reason ``tool_calls``.
    """

    def feed(self, text: str) -> list[Delta]: ...

    def close(self) -> list[Delta]: ...


OutputParserFactory = Callable[[GenerationRequest, ModelSpec], OutputParser]


class PlainTextParser:
    """Everything the model writes is visible text."""

    def feed(self, text: str) -> list[Delta]:
        return [TextDelta(text)] if text else []

    def close(self) -> list[Delta]:
        return []


def plain_text(request: GenerationRequest, spec: ModelSpec) -> OutputParser:
    return PlainTextParser()


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one generation needs, prepared on the event loop before generation starts."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...]
    grammar: str | None
    grammar_source: str
    """The request parameter the grammar was made from, named when llama.cpp rejects it."""
    max_tokens: int | None
    sampling: dict[str, float]
    logprobs: bool = False
    top_logprobs: int = 0


class LocalModel:
    """A loaded model: its vocabulary here, its llama-server there, and its slots."""

    def __init__(self, spec: ModelSpec, vocabulary: Vocabulary, server: LlamaServer, slots: SlotPool) -> None:
        self.spec = spec
        self.vocabulary = vocabulary
        self.server = server
        self.slots = slots
        self.context_window = server.options.context

    async def save(self) -> None:
        """Save every slot that holds something (``slot-<i>.bin``); a file of a slot that
        is empty now is removed, so a restart does not restore what is gone."""
        names = _slot_files(self.slots.size)
        saved = await self.server.save_slots(names)
        for slot, name in names.items():
            if slot not in saved:
                with contextlib.suppress(OSError):
                    (self.server.options.slot_dir / name).unlink()

    async def restore(self) -> None:
        """Restore the slots saved by :meth:`save` at the last shutdown."""
        restored = await self.server.restore_slots(_slot_files(self.slots.size))
        if restored:
            log.info("restored the prompt cache of %s: %d slot(s)", self.spec.id, len(restored))

    async def close(self) -> None:
        with contextlib.suppress(ORSError, OSError):
            if self.server.running:
                await self.save()
        await self.server.stop()
        self.vocabulary.close()


def _slot_files(slots: int) -> dict[int, str]:
    return {slot: f"slot-{slot}.bin" for slot in range(slots)}


class _Entry:
    """One served model id: its spec, and the model once started."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.model: LocalModel | None = None
        self.loading: asyncio.Future[LocalModel] | None = None


class LocalBackend(Backend):
    """Serves the embedded models (see ``model_files.LOCAL_MODELS``) with llama-server."""

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
        (0: never).
        """
        served = list(LOCAL_MODELS) if models is None else list(models)
        unknown = [m for m in [*served, *preload] if m not in LOCAL_MODELS]
        if unknown:
            raise ValueError(f"Unknown local models: {', '.join(unknown)}; known: {', '.join(LOCAL_MODELS)}")
        self._data_dir = Path(cache_dir)
        self._files = ModelFiles(cache_dir)
        self._n_threads = n_threads or _available_cpus()
        self._n_ctx = n_ctx
        self._preload = list(preload)
        self._output_parser = output_parser
        self._parallel = parallel
        self._queue = queue
        self._cache_ram_mib = cache_ram_mib
        self._kv_type = kv_type
        self._chunk = chunk
        self._server_binary = server_binary
        self._hang_seconds = hang_seconds
        self._entries = {model: _Entry(LOCAL_MODELS[model]) for model in served}
        for model in self._preload:
            self._entries.setdefault(model, _Entry(LOCAL_MODELS[model]))

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=m, owned_by="ors", context_window=self.context_window(m)) for m in self._entries]

    def serves(self, model: str) -> bool:
        return model in self._entries

    def gauges(self) -> list[ModelGauges]:
        return [
            ModelGauges(model, entry.model.slots.size, entry.model.slots.busy, entry.model.slots.waiting,
                        up=entry.model.server.state is ServerState.RUNNING, restarts=entry.model.server.restarts)
            for model, entry in self._entries.items()
            if entry.model is not None
        ]

    def context_window(self, model: str) -> int:
        """Tokens of context (prompt plus output) that ``model`` runs with."""
        return self._n_ctx or self._entry(model).spec.context_window

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
        for model in self._preload:
            await self._loaded(self._entry(model))

    async def aclose(self) -> None:
        """Stop every model's server, saving its slots' prompt caches first."""
        for entry in self._entries.values():
            if entry.loading is not None:
                with contextlib.suppress(ORSError):
                    await asyncio.shield(entry.loading)
            if entry.model is not None:
                await entry.model.close()
            entry.model, entry.loading = None, None

    async def count_tokens(self, model: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()) -> int:
        """Prompt tokens of ``messages`` (and ``tools``) rendered with the model's template."""
        loaded = await self._loaded(self._entry(model))
        return len(await asyncio.to_thread(loaded.vocabulary.prompt_tokens, tuple(messages), tuple(tools)))

    async def check(self, request: GenerationRequest) -> None:
        """Schemas that cannot become a grammar are refused before the response starts,
        and so is a request that would find the model's queue full (429)."""
        loaded = await self._loaded(self._entry(request.model))
        plan = await self._planned(request, loaded)
        if plan.grammar is not None and not await asyncio.to_thread(loaded.vocabulary.accepts_grammar, plan.grammar):
            raise InvalidRequest(
                "The local model cannot enforce this schema: llama.cpp rejected the grammar made from it",
                param=plan.grammar_source,
            )
        loaded.slots.check()

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        entry = self._entry(request.model)
        loaded = await self._loaded(entry)
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
        parser = self._output_parser(request, entry.spec)
        ledger = LogprobLedger() if plan.logprobs else None
        slot = await loaded.slots.acquire()
        try:
            body = {
                "prompt": tokens,
                "n_predict": max_tokens,
                "cache_prompt": True,
                **plan.sampling,
                **({"grammar": plan.grammar} if plan.grammar is not None else {}),
                **({"n_probs": max(1, plan.top_logprobs)} if plan.logprobs else {}),
            }
            called_tools = False
            last: dict[str, Any] = {}
            async with contextlib.aclosing(loaded.server.complete(body)) as chunks:
                async for chunk in chunks:
                    text = chunk.get("content") or ""
                    if ledger is not None:
                        _record(ledger, text, chunk.get("completion_probabilities") or (), plan.top_logprobs)
                    deltas = parser.feed(text) if text else []
                    if chunk.get("stop"):
                        deltas += parser.close()
                        last = chunk
                    if ledger is not None:
                        deltas = ledger.attribute(deltas)
                    for delta in deltas:
                        called_tools = called_tools or isinstance(delta, ToolCallDelta)
                        yield delta
            timings = last.get("timings") or {}
            produced = int(timings.get("predicted_n", last.get("tokens_predicted", 0)))
            reason = _STOP_REASONS.get(str(last.get("stop_type")), "stop")
            if reason == "stop" and called_tools:
                reason = "tool_calls"
            yield Finish(
                reason,
                Usage(input_tokens=len(tokens), output_tokens=produced, cached_tokens=int(timings.get("cache_n", 0))),
            )
        finally:
            loaded.slots.release(slot)

    def _entry(self, model: str) -> _Entry:
        try:
            return self._entries[model]
        except KeyError:
            raise ModelNotFound(f"The model '{model}' does not exist", param="model") from None

    async def _planned(self, request: GenerationRequest, model: LocalModel) -> _Plan:
        """``_plan``, in a worker thread when it converts a schema into a grammar (CPU work
        that grows with the schema), inline otherwise."""
        if request.tools or request.output_format.kind != "text":
            return await asyncio.to_thread(self._plan, request, model)
        return self._plan(request, model)

    def _plan(self, request: GenerationRequest, model: LocalModel) -> _Plan:
        """Raises ``InvalidRequest`` for a schema that cannot be made into a grammar."""
        chosen = request.sampling
        defaults = model.spec.sampling
        grammar, source = tool_call_grammar(request.tools, request.tool_policy, model.vocabulary.call_shape), "tools"
        if grammar is None:
            grammar, source = output_grammar(request.output_format), "text.format.schema"
        if grammar is not None:
            grammar = unicode_text(grammar)
        return _Plan(
            messages=request.messages,
            tools=request.tools,
            grammar=grammar,
            grammar_source=source,
            max_tokens=chosen.max_output_tokens or model.spec.default_max_output_tokens,
            sampling={
                "temperature": defaults.temperature if chosen.temperature is None else chosen.temperature,
                "top_p": defaults.top_p if chosen.top_p is None else chosen.top_p,
                "top_k": defaults.top_k,
                "min_p": defaults.min_p,
                "repeat_penalty": defaults.repeat_penalty,
                "presence_penalty": chosen.presence_penalty or 0.0,
                "frequency_penalty": chosen.frequency_penalty or 0.0,
            },
            logprobs=chosen.logprobs,
            top_logprobs=chosen.top_logprobs or 0,
        )

    async def _loaded(self, entry: _Entry) -> LocalModel:
        """The entry's model, started once; a cancelled waiter does not cancel the start."""
        if entry.model is not None:
            return entry.model
        if entry.loading is None:
            entry.loading = asyncio.ensure_future(self._load(entry.spec))
        loading = entry.loading
        try:
            entry.model = await asyncio.shield(loading)
        except ORSError:
            if entry.loading is loading:
                entry.loading = None
            raise
        return entry.model

    async def _load(self, spec: ModelSpec) -> LocalModel:
        try:
            path = await asyncio.to_thread(self._files.path, spec.id)
            vocabulary = await asyncio.to_thread(Vocabulary, spec, path)
        except ORSError:
            raise
        except Exception as exc:
            raise ModelError(f"The model '{spec.id}' failed to load: {exc}") from exc
        options = ServerOptions(
            model_path=path,
            context=self.context_window(spec.id),
            parallel=self._parallel,
            threads=self._n_threads,
            cache_ram_mib=self._cache_ram_mib,
            slot_dir=self._data_dir / "kv" / spec.id,
            kv_type=self._kv_type,
            batch=self._chunk,
        )
        server = LlamaServer(find_binary(self._server_binary), options, self._data_dir / "logs" / f"{spec.id}.log",
                             hang_seconds=self._hang_seconds)
        try:
            await server.start()
        except BaseException:
            vocabulary.close()
            raise
        model = LocalModel(spec, vocabulary, server, SlotPool(self._parallel, self._queue))
        await model.restore()
        server.on_restart = model.restore  # a server started again after an exit gets them back too
        return model


def _record(ledger: LogprobLedger, text: str, probabilities: Sequence[dict[str, Any]], top: int) -> None:
    """The tokens of one streamed chunk into the ledger: the chunk's text goes with its
    last token (a chunk holds several tokens only when they complete one character)."""
    for position, entry in enumerate(probabilities):
        token_text = text if position == len(probabilities) - 1 else ""
        alternatives = tuple(_logprob(other, str(other.get("token", "")))
                             for other in entry.get("top_logprobs", ())[:top])
        ledger.add(token_text, _logprob(entry, token_text, alternatives))


def _logprob(entry: dict[str, Any], text: str, top: tuple[TokenLogprob, ...] = ()) -> TokenLogprob:
    raw = entry.get("bytes")
    token_bytes = bytes(raw) if isinstance(raw, list) else str(entry.get("token", "")).encode()
    return TokenLogprob(text, float(entry.get("logprob", float("-inf"))), token_bytes, top)


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
