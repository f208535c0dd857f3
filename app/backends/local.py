"""The embedded model backend: GGUF models run in-process by llama.cpp.

Threads and cancellation, the contract in full:

* One ``llama_cpp.Llama`` per model, loaded lazily (or in ``start()``) on a worker thread.
  Concurrent first requests share one load.
* A ``Llama`` is not thread-safe, so each model has an ``asyncio.Lock``: one generation at
  a time per model, the others wait their turn in FIFO order.
* A generation runs on its own worker thread. Text pieces travel to the event loop through
  ``loop.call_soon_threadsafe`` into an ``asyncio.Queue``; the event loop never blocks.
  When logprobs are asked, the worker sends one :class:`_Token` per generated token
  instead (its text, possibly empty, and its logprob), and nothing more is computed
  otherwise.
* The worker emits exactly one terminal item (``Finish`` or an ``ORSError``) as its very
  last act on the model. When the consumer closes the stream or its task is cancelled, a
  ``threading.Event`` asks the worker to stop; it checks the event before every prompt
  chunk and every sampled token. The model lock is released only once the terminal item
  has arrived, i.e. once the worker no longer touches the model.
* A ``LocalBackend`` belongs to one event loop (its locks and queues do).

Tools: every tool of the request is rendered into the prompt whatever the tool policy
(``prompting``); the default output parser turns the model's written calls into
``ToolCallDelta``s and enforces the policy, and a grammar forces a call when one is
required (``toolcalls``).

Logprobs (``sampling.logprobs``): the log-softmax of the logits row the token was sampled
from (llama.cpp's last output row, read right after sampling, before the next decode; no
``logits_all`` needed), so the model's own distribution, before temperature and grammar.
The token's text is what the UTF-8 decoder made of it; its bytes and the alternatives' come
from ``detokenize`` (alternatives with special tokens spelled out, e.g. an end-of-turn
token). The output parser may hold back, merge or drop text, so the tokens are attributed
to its emitted ``TextDelta``s afterwards by a ``LogprobLedger`` (``logprob_ledger``):
exact where the text passes through unchanged.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# llama.cpp's OpenMP threads busy-wait between tokens by default. When cores are shared
# (other processes, or two models generating at once) that slows generation down by an
# order of magnitude. libgomp reads this setting once, when llama_cpp first loads it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402
from llama_cpp import Llama, LlamaGrammar  # noqa: E402

from app.backends.base import (  # noqa: E402
    Backend,
    ChatMessage,
    Delta,
    Finish,
    GenerationRequest,
    ModelInfo,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from app.backends.logprob_ledger import LogprobLedger  # noqa: E402
from app.backends.model_files import LOCAL_MODELS, ModelFiles, ModelSpec  # noqa: E402
from app.backends.prompting import ChatTemplate, output_grammar, prompt_messages, template_tools  # noqa: E402
from app.backends.toolcalls import TAG_CLOSE, TAG_OPEN, call_shape, tool_call_grammar, tool_call_parser  # noqa: E402
from app.errors import ContextLengthExceeded, InvalidRequest, ModelError, ModelNotFound, ORSError  # noqa: E402

PREFILL_CHUNK = 256
"""Prompt tokens evaluated between two checks of the stop event."""


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


@dataclass(frozen=True, slots=True)
class _Token:
    """One generated token, sent by the worker when logprobs are asked: its text as the
    UTF-8 decoder gave it (empty for a token that completes no character) and its logprob."""

    text: str
    logprob: TokenLogprob


Emit = Callable[[str | _Token], None]


class LocalModel:
    """A loaded GGUF model with its chat template. Blocking methods: call off the loop."""

    def __init__(self, spec: ModelSpec, path: Path, *, n_ctx: int, n_threads: int) -> None:
        self.spec = spec
        self.context_window = n_ctx
        with _llama_model_params(use_extra_bufts=_weight_repacking_is_safe()):
            self.llm = Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                verbose=False,
            )
        self._vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise ModelError(f"The model '{spec.id}' has no chat template in its GGUF file")
        self.template = ChatTemplate(
            template, bos_token=self._special_text(self.llm.token_bos()), eos_token=self._special_text(self.llm.token_eos())
        )
        self.call_shape = call_shape(spec.template_renders_tools, self._tag_tokens())

    def prompt(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        """The prompt text: the conversation and all ``tools``, whatever the tool policy."""
        renders_tools = self.spec.template_renders_tools
        return self.template.render(
            prompt_messages(messages, tools, template_renders_tools=renders_tools),
            template_tools(tools) if renders_tools else None,
        )

    def prompt_tokens(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> list[int]:
        return self.llm.tokenize(self.prompt(messages, tools).encode("utf-8"), add_bos=False, special=True)

    def accepts_grammar(self, grammar: str) -> bool:
        """Whether llama.cpp parses ``grammar`` (it would crash the sampler otherwise)."""
        sampler = llama_cpp.llama_sampler_init_grammar(self._vocab, grammar.encode("utf-8"), b"root")
        if not sampler:
            return False
        llama_cpp.llama_sampler_free(sampler)
        return True

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def generate(self, plan: _Plan, stop: threading.Event, emit: Emit) -> Finish:
        """Generate on the calling thread, emitting text pieces (or, when ``plan.logprobs``,
        every token as a ``_Token``); stop early once ``stop`` is set."""
        llm = self.llm
        tokens = self.prompt_tokens(plan.messages, plan.tools)
        n_ctx = self.context_window
        if len(tokens) >= n_ctx:
            raise ContextLengthExceeded(
                f"The input takes {len(tokens)} tokens, but model '{self.spec.id}' has a context "
                f"window of {n_ctx} tokens for input and output together.",
                param="input",
            )
        budget = n_ctx - len(tokens)
        max_tokens = budget if plan.max_tokens is None else min(plan.max_tokens, budget)
        grammar = None
        if plan.grammar is not None:
            if not self.accepts_grammar(plan.grammar):
                raise InvalidRequest(
                    "The local model cannot enforce this schema: llama.cpp rejected the grammar made from it",
                    param=plan.grammar_source,
                )
            grammar = LlamaGrammar.from_string(plan.grammar, verbose=False)
        usage = Usage(input_tokens=len(tokens))
        if max_tokens <= 0:
            return Finish("length", usage)
        cached = self._prefill(tokens, stop)
        if cached is None:
            return Finish("stop", usage)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # holds back split characters
        produced, reason = 0, "stop"
        tokens_out = llm.generate(tokens, grammar=grammar, **plan.sampling)
        try:
            for token in tokens_out:
                if stop.is_set() or self.is_end_of_generation(token):
                    break
                produced += 1
                piece = llm.detokenize([token])
                if plan.logprobs:
                    text = decoder.decode(piece)
                    emit(_Token(text, self._logprob(token, text, piece, plan.top_logprobs)))
                elif text := decoder.decode(piece):
                    emit(text)
                if produced >= max_tokens:
                    reason = "length"
                    break
        finally:
            tokens_out.close()
        return Finish(reason, Usage(input_tokens=len(tokens), output_tokens=produced, cached_tokens=cached))

    def _logprob(self, token: int, text: str, piece: bytes, top: int) -> TokenLogprob:
        """``token``'s logprob from the logits row it was just sampled from (the context's
        last output row, valid until the next decode), with ``top`` alternatives."""
        llm = self.llm
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        logprobs = Llama.logits_to_logprobs(logits)
        alternatives: tuple[TokenLogprob, ...] = ()
        if top > 0:
            best = np.argpartition(logprobs, -top)[-top:]
            best = best[np.argsort(-logprobs[best], kind="stable")]
            alternatives = tuple(self._alternative(int(other), float(logprobs[other])) for other in best)
        return TokenLogprob(text, float(logprobs[token]), piece, alternatives)

    def _alternative(self, token: int, logprob: float) -> TokenLogprob:
        piece = self.llm.detokenize([token], special=True)
        return TokenLogprob(piece.decode("utf-8", errors="replace"), logprob, piece)

    def close(self) -> None:
        self.llm.close()

    def _prefill(self, tokens: list[int], stop: threading.Event) -> int | None:
        """Evaluate all prompt tokens but the last, in chunks, reusing the KV cache's prefix.

        Returns how many tokens were reused from the cache, or ``None`` if ``stop`` was set.
        ``Llama.generate`` then finds the prompt cached and evaluates only the last token.
        """
        llm = self.llm
        cached = 0
        for old, new in zip(llm.input_ids[: llm.n_tokens].tolist(), tokens[:-1]):
            if old != new:
                break
            cached += 1
        llm.n_tokens = cached
        for start in range(cached, len(tokens) - 1, PREFILL_CHUNK):
            if stop.is_set():
                return None
            llm.eval(tokens[start : min(start + PREFILL_CHUNK, len(tokens) - 1)])
        return None if stop.is_set() else cached

    def _tag_tokens(self) -> tuple[int, int] | None:
        """The vocabulary's single tokens for the tool call tags, if it has them."""
        tokens = [self.llm.tokenize(tag.encode("utf-8"), add_bos=False, special=True) for tag in (TAG_OPEN, TAG_CLOSE)]
        if all(len(ids) == 1 for ids in tokens):
            return tokens[0][0], tokens[1][0]
        return None

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self.llm.detokenize([token], special=True).decode("utf-8", errors="replace")


class _Generation:
    """One generation on a worker thread, its output handed over to the event loop.

    The worker calls ``target(stop, emit)``; the text pieces (or ``_Token``s) passed to
    ``emit`` and then the terminal item (the returned ``Finish`` or the raised error as an
    ``ORSError``) arrive in order through ``next()``. The terminal item is emitted after
    ``target`` returns, so receiving it means the worker is done with the model.
    """

    def __init__(self, name: str, target: Callable[[threading.Event, Emit], Finish]) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[str | _Token | Finish | ORSError] = asyncio.Queue()
        self._stop = threading.Event()
        self._finished = False
        self._target = target
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    async def next(self) -> str | _Token | Finish:
        """The next text piece (or token) or the final ``Finish``; raises the worker's error."""
        item = await self._queue.get()
        if not isinstance(item, str | _Token):
            self._finished = True
        if isinstance(item, ORSError):
            raise item
        return item

    async def wait_stopped(self) -> None:
        """Return once the worker has emitted its terminal item, draining the rest.

        A cancellation that arrives meanwhile is held back and re-raised afterwards, so the
        caller never releases the model while the worker still uses it.
        """
        held: asyncio.CancelledError | None = None
        while not self._finished:
            try:
                await self.next()
            except asyncio.CancelledError as exc:
                held = exc
            except ORSError:
                pass
        if held is not None:
            raise held

    def _run(self) -> None:
        outcome: Finish | ORSError = ModelError("The local model stopped unexpectedly")
        try:
            outcome = self._target(self._stop, self._emit)
        except ORSError as exc:
            outcome = exc
        except Exception as exc:  # llama.cpp and its bindings fail with assorted types
            outcome = ModelError(f"The local model failed: {exc}")
        finally:
            self._emit(outcome)

    def _emit(self, item: str | _Token | Finish | ORSError) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody listens any more
            self._stop.set()


class _Slot:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.model: LocalModel | None = None
        self.loading: asyncio.Future[LocalModel] | None = None
        self.lock = asyncio.Lock()


class LocalBackend(Backend):
    """Serves the embedded models (see ``model_files.LOCAL_MODELS``) with llama.cpp."""

    def __init__(
        self,
        cache_dir: Path,
        *,
        n_threads: int | None = None,
        n_ctx: int | None = None,
        preload: Sequence[str] = (),
        models: Sequence[str] | None = None,
        output_parser: OutputParserFactory = tool_call_parser,
    ) -> None:
        """Configure; nothing is loaded before ``start()`` or first use.

        ``cache_dir`` holds assembled model files (the server's data directory);
        ``n_threads`` defaults to the CPUs this process may run on; ``n_ctx`` overrides each
        model's context window; ``preload`` lists models to load in ``start()``; ``models``
        limits the served ids (default: all of ``LOCAL_MODELS``); ``output_parser`` makes
        the parser of each generation's text (default: ``toolcalls.tool_call_parser``).
        """
        served = list(LOCAL_MODELS) if models is None else list(models)
        unknown = [m for m in [*served, *preload] if m not in LOCAL_MODELS]
        if unknown:
            raise ValueError(f"Unknown local models: {', '.join(unknown)}; known: {', '.join(LOCAL_MODELS)}")
        self._files = ModelFiles(cache_dir)
        self._n_threads = n_threads or _available_cpus()
        self._n_ctx = n_ctx
        self._preload = list(preload)
        self._output_parser = output_parser
        self._slots = {model: _Slot(LOCAL_MODELS[model]) for model in served}
        for model in self._preload:
            self._slots.setdefault(model, _Slot(LOCAL_MODELS[model]))

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=m, owned_by="ors", context_window=self.context_window(m)) for m in self._slots]

    def serves(self, model: str) -> bool:
        return model in self._slots

    def context_window(self, model: str) -> int:
        """Tokens of context (prompt plus output) that ``model`` runs with."""
        return self._n_ctx or self._slot(model).spec.context_window

    async def start(self) -> None:
        for model in self._preload:
            await self._loaded(self._slot(model))

    async def aclose(self) -> None:
        """Free every model, each once its running generation (if any) has ended."""
        for slot in self._slots.values():
            if slot.loading is not None:
                with contextlib.suppress(ORSError):
                    await asyncio.shield(slot.loading)
            async with slot.lock:
                if slot.model is not None:
                    slot.model.close()
                slot.model, slot.loading = None, None

    async def count_tokens(self, model: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()) -> int:
        """Prompt tokens of ``messages`` (and ``tools``) rendered with the model's template.

        Tokenizing reads only the vocabulary, so it does not wait for a running generation.
        """
        loaded = await self._loaded(self._slot(model))
        return len(await asyncio.to_thread(loaded.prompt_tokens, tuple(messages), tuple(tools)))

    async def check(self, request: GenerationRequest) -> None:
        """Schemas that cannot become a grammar are refused before the response starts."""
        loaded = await self._loaded(self._slot(request.model))
        plan = self._plan(request, loaded)
        if plan.grammar is not None and not loaded.accepts_grammar(plan.grammar):
            raise InvalidRequest(
                "The local model cannot enforce this schema: llama.cpp rejected the grammar made from it",
                param=plan.grammar_source,
            )

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        slot = self._slot(request.model)
        loaded = await self._loaded(slot)
        plan = self._plan(request, loaded)
        parser = self._output_parser(request, slot.spec)
        ledger = LogprobLedger() if plan.logprobs else None
        async with slot.lock:
            generation = _Generation(
                f"ors-generate-{slot.spec.id}", lambda stop, emit: loaded.generate(plan, stop, emit)
            )
            generation.start()
            try:
                called_tools = False
                while True:
                    item = await generation.next()
                    if isinstance(item, Finish):
                        deltas = parser.close()
                    elif isinstance(item, _Token):
                        assert ledger is not None
                        ledger.add(item.text, item.logprob)
                        deltas = parser.feed(item.text) if item.text else []
                    else:
                        deltas = parser.feed(item)
                    if ledger is not None:
                        deltas = ledger.attribute(deltas)
                    for delta in deltas:
                        called_tools = called_tools or isinstance(delta, ToolCallDelta)
                        yield delta
                    if isinstance(item, Finish):
                        reason = "tool_calls" if called_tools and item.reason == "stop" else item.reason
                        yield Finish(reason, item.usage)
                        return
            finally:
                generation.stop()
                await generation.wait_stopped()

    def _slot(self, model: str) -> _Slot:
        try:
            return self._slots[model]
        except KeyError:
            raise ModelNotFound(f"The model '{model}' does not exist", param="model") from None

    def _plan(self, request: GenerationRequest, model: LocalModel) -> _Plan:
        """Raises ``InvalidRequest`` for a schema that cannot be made into a grammar."""
        chosen = request.sampling
        defaults = model.spec.sampling
        grammar, source = tool_call_grammar(request.tools, request.tool_policy, model.call_shape), "tools"
        if grammar is None:
            grammar, source = output_grammar(request.output_format), "text.format.schema"
        return _Plan(
            messages=request.messages,
            tools=request.tools,
            grammar=grammar,
            grammar_source=source,
            max_tokens=chosen.max_output_tokens,
            sampling={
                "temp": defaults.temperature if chosen.temperature is None else chosen.temperature,
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

    async def _loaded(self, slot: _Slot) -> LocalModel:
        """The slot's model, loading it once; a cancelled waiter does not cancel the load."""
        if slot.model is not None:
            return slot.model
        if slot.loading is None:
            slot.loading = asyncio.ensure_future(asyncio.to_thread(self._load, slot.spec))
        loading = slot.loading
        try:
            slot.model = await asyncio.shield(loading)
        except ORSError:
            if slot.loading is loading:
                slot.loading = None
            raise
        return slot.model

    def _load(self, spec: ModelSpec) -> LocalModel:
        try:
            path = self._files.path(spec.id)
            return LocalModel(spec, path, n_ctx=self.context_window(spec.id), n_threads=self._n_threads)
        except ORSError:
            raise
        except Exception as exc:
            raise ModelError(f"The model '{spec.id}' failed to load: {exc}") from exc


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_MODEL_PARAMS_LOCK = threading.Lock()


@contextlib.contextmanager
def _llama_model_params(**fields: Any) -> Iterator[None]:
    """Make ``Llama()`` load with these ``llama_model_params`` fields set.

    ``Llama()`` exposes no argument for some fields, so the default-params factory it calls
    is wrapped for the duration of one load; loads are serialised by a lock.
    """
    with _MODEL_PARAMS_LOCK:
        original = llama_cpp.llama_cpp.llama_model_default_params

        def with_fields() -> Any:
            params = original()
            for name, value in fields.items():
                setattr(params, name, value)
            return params

        llama_cpp.llama_cpp.llama_model_default_params = with_fields
        try:
            yield
        finally:
            llama_cpp.llama_cpp.llama_model_default_params = original


def _weight_repacking_is_safe() -> bool:
    """Whether llama.cpp may put weights into its extra (repacked) CPU buffers.

    A build that includes the AMX kernels crashes (SIGSEGV in ``ldtilecfg``) on virtual
    machines that advertise AMX without enabling it, on the first batched decode. Without
    the extra buffers the AMX kernels are never used; decoding is somewhat slower.
    """
    return b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info()
