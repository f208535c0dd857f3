"""One embedded generation in llama-server's terms: the request made into the body of a
``POST /completion`` (:func:`make_plan`, :func:`completion_body`), and its streamed chunks read
back into deltas (:class:`CompletionReader`).

The plan: a grammar when one is needed (a tool call the policy requires, else a JSON
Schema output format, else, under ``auto``, the call grammar applied lazily, from the
model's opening tag token on: ``grammar``, ``prompting``), the model's own sampling
defaults under what the request sets, the output budget, and logprobs (llama-server's
``n_probs``: the log-softmax of the model's own distribution at each position, before
sampling).

The chunks: each one's ``content`` goes through the generation's output parser (which
turns the model's written tool calls into ``ToolCallDelta``s); logprobs are attributed to
the parser's ``TextDelta``s by a ``LogprobLedger`` (exact where the text passes through
unchanged); the last chunk (``stop: true``) gives the finish reason and the usage,
``cached_tokens`` being llama-server's own count of reused prompt tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.backends.base import (
    ChatMessage,
    Delta,
    Finish,
    FinishReason,
    GenerationRequest,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from app.backends.call_syntax import TAG_OPEN
from app.backends.grammar import BARE_CALL_TRIGGER, check_text_grammars, lazy_call_grammar
from app.backends.logprob_ledger import LogprobLedger
from app.backends.model_files import ModelSpec
from app.backends.prompting import output_grammar, unicode_text
from app.backends.toolcalls import tool_call_grammar
from app.backends.vocabulary import Vocabulary
from app.errors import InvalidRequest

TRIGGER_TOKEN = 0
"""llama.cpp's ``COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN``: a trigger that is one token id."""
TRIGGER_PATTERN_FULL = 3
"""llama.cpp's ``COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL``: a regular expression the whole
text generated so far must match."""

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
class Plan:
    """What one generation needs, prepared on the event loop before generation starts."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...]
    grammar: str | None
    grammar_source: str
    """The request parameter the grammar was made from, named when llama.cpp rejects it."""
    lazy: bool
    """Whether llama-server applies the grammar only once the model opens a call
    (``grammar_lazy``, :func:`lazy_triggers`), rather than from the first token."""
    call_token: int | None
    """The vocabulary's single token that opens a tagged call, if it has one."""
    max_tokens: int | None
    sampling: dict[str, float]
    logprobs: bool = False
    top_logprobs: int = 0


def make_plan(request: GenerationRequest, spec: ModelSpec, vocabulary: Vocabulary) -> Plan:
    """The plan of ``request`` on the model of ``spec``. CPU work that grows with a
    schema or a custom tool's Lark grammar (made into a grammar); raises
    ``InvalidRequest`` for one that cannot be."""
    chosen = request.sampling
    defaults = spec.sampling
    callable_tools = (*request.tools, *request.late_tools) if request.late_tools else request.tools
    check_text_grammars(callable_tools)
    shape = vocabulary.call_shape
    grammar, source = tool_call_grammar(callable_tools, request.tool_policy, shape), "tools"
    if grammar is None:
        grammar, source = output_grammar(request.output_format), "text.format.schema"
    lazy = False
    if grammar is None and request.tool_policy.mode == "auto":
        grammar, source = _lazy_grammar(callable_tools, request, vocabulary), "tools"
        lazy = grammar is not None
    if grammar is not None:
        grammar = unicode_text(grammar)
    return Plan(
        messages=request.messages,
        tools=request.tools,
        grammar=grammar,
        grammar_source=source,
        lazy=lazy,
        call_token=shape.trigger,
        max_tokens=chosen.max_output_tokens or spec.default_max_output_tokens,
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


def _lazy_grammar(tools: Sequence[ToolSpec], request: GenerationRequest, vocabulary: Vocabulary) -> str | None:
    """The call grammar under ``auto``, or ``None`` (free text, every call parsed
    afterwards) when a tool's schema cannot become one or llama.cpp refuses it: a call
    the model may choose not to make does not fail the request."""
    try:
        grammar = lazy_call_grammar(tools, request.tool_policy, vocabulary.call_shape)
    except InvalidRequest:
        return None
    if grammar is None or not vocabulary.accepts_grammar(unicode_text(grammar)):
        return None
    return grammar


def completion_body(plan: Plan, tokens: list[int], max_tokens: int) -> dict[str, Any]:
    """The ``POST /completion`` body: the prompt as token ids with ``cache_prompt`` (the
    prefix llama-server already holds is not evaluated again), at most ``max_tokens``."""
    return {
        "prompt": tokens,
        "n_predict": max_tokens,
        "cache_prompt": True,
        **plan.sampling,
        **({"grammar": plan.grammar} if plan.grammar is not None else {}),
        **(lazy_triggers(plan.call_token) if plan.lazy else {}),
        **({"n_probs": max(1, plan.top_logprobs)} if plan.logprobs else {}),
    }


def lazy_triggers(call_token: int | None) -> dict[str, Any]:
    """The grammar waits for the model to open a call: with ``call_token`` (the opening
    tag, the grammar's own first element, so nothing is replayed into it), or bare or
    fenced at the start of the answer (:data:`~app.backends.grammar.BARE_CALL_TRIGGER`:
    llama-server replays the text from the object's brace into the grammar)."""
    tag = [{"type": TRIGGER_TOKEN, "value": TAG_OPEN, "token": call_token}] if call_token is not None else []
    return {"grammar_lazy": True,
            "grammar_triggers": [*tag, {"type": TRIGGER_PATTERN_FULL, "value": BARE_CALL_TRIGGER}]}


class CompletionReader:
    """Reads one generation's chunks (see the module docstring): :meth:`feed` each chunk,
    then :meth:`finish` once the last one came."""

    def __init__(self, parser: OutputParser, plan: Plan) -> None:
        self.parser = parser
        self.top_logprobs = plan.top_logprobs
        self.ledger = LogprobLedger() if plan.logprobs else None
        self.called_tools = False
        self.last: dict[str, Any] = {}

    def feed(self, chunk: dict[str, Any]) -> list[Delta]:
        text = chunk.get("content") or ""
        ledger = self.ledger
        if ledger is not None:
            _record(ledger, text, chunk.get("completion_probabilities") or (), self.top_logprobs)
        deltas = self.parser.feed(text) if text else []
        if chunk.get("stop"):
            deltas += self.parser.close()
            self.last = chunk
        if ledger is not None:
            deltas = ledger.attribute(deltas)
        if not self.called_tools:
            self.called_tools = any(isinstance(delta, ToolCallDelta) for delta in deltas)
        return deltas

    def finish(self, input_tokens: int) -> Finish:
        """The terminal delta, from the last chunk (``stop_type``, ``timings``)."""
        last = self.last
        timings = last.get("timings") or {}
        produced = int(timings.get("predicted_n", last.get("tokens_predicted", 0)))
        reason = _STOP_REASONS.get(str(last.get("stop_type")), "stop")
        if reason == "stop" and self.called_tools:
            reason = "tool_calls"
        return Finish(reason, Usage(input_tokens=input_tokens, output_tokens=produced,
                                    cached_tokens=int(timings.get("cache_n", 0))))


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
