"""A deterministic backend for unit tests: it plays back scripted deltas.

Never a default: tests construct it explicitly. Each served model has a script, either a
fixed list of deltas or a function of the :class:`GenerationRequest` (which may also raise
an ``ORSError`` to simulate a refusal). A script without a ``Finish`` gets
``Finish("stop")`` appended, and a ``Finish`` without usage gets usage counted
deterministically: whitespace-separated words of the input, one output token per content
delta.

Every request is recorded in ``requests`` so a test can check what the engine sent, and
every stream that was closed or cancelled before its end is recorded in ``cancelled``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from app.backends.base import (
    Backend,
    Delta,
    Finish,
    FinishReason,
    GenerationRequest,
    ModelInfo,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from app.errors import InvalidRequest, ModelError, ModelNotFound, ORSError

ScriptFunction = Callable[[GenerationRequest], "Iterable[Delta] | Awaitable[Iterable[Delta]]"]


@dataclass(frozen=True)
class Script:
    """How a scripted model answers.

    ``deltas`` is the answer (or a function producing it). With ``fail_after`` set, the
    stream yields that many content deltas (never the ``Finish``) and then raises
    ``error``, simulating a failure mid-stream.
    """

    deltas: Sequence[Delta] | ScriptFunction
    delay: float = 0.0
    """Seconds to wait before each delta."""
    fail_after: int | None = None
    error: ORSError = field(default_factory=lambda: ModelError("Scripted failure"))


def text_script(*pieces: str, reason: FinishReason = "stop") -> list[Delta]:
    """A script that writes ``pieces`` as text deltas and then finishes."""
    deltas: list[Delta] = [TextDelta(piece) for piece in pieces]
    return [*deltas, Finish(reason)]


def tool_call_script(name: str, arguments: str, *, call_id: str | None = None, pieces: int = 1) -> list[Delta]:
    """A script that calls one tool, its arguments split into ``pieces`` deltas."""
    size = max(1, -(-len(arguments) // max(1, pieces)))
    chunks = [arguments[i : i + size] for i in range(0, len(arguments), size)] or [""]
    deltas: list[Delta] = [ToolCallDelta(index=0, name=name, call_id=call_id, arguments=chunks[0])]
    deltas += [ToolCallDelta(index=0, arguments=chunk) for chunk in chunks[1:]]
    return [*deltas, Finish("tool_calls")]


class ScriptedBackend(Backend):
    def __init__(self, scripts: Mapping[str, Script | Sequence[Delta] | ScriptFunction]) -> None:
        self.scripts: dict[str, Script] = {
            model: script if isinstance(script, Script) else Script(script) for model, script in scripts.items()
        }
        self.requests: list[GenerationRequest] = []
        self.cancelled: list[GenerationRequest] = []

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=model, owned_by="scripted") for model in self.scripts]

    def serves(self, model: str) -> bool:
        return model in self.scripts

    async def check(self, request: GenerationRequest) -> None:
        """Scripts have no token probabilities: a request for logprobs is refused."""
        if request.sampling.logprobs:
            raise InvalidRequest(
                f"The model '{request.model}' cannot return logprobs: remove "
                "'message.output_text.logprobs' from include and set top_logprobs to 0.",
                code="unsupported_include",
                param="include",
            )

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        self.requests.append(request)
        script = self.scripts.get(request.model)
        if script is None:
            raise ModelNotFound(f"The model '{request.model}' does not exist", param="model")
        deltas = await self._play(script, request)
        if script.fail_after is not None:
            deltas = [delta for delta in deltas if not isinstance(delta, Finish)][: script.fail_after]
        try:
            for delta in deltas:
                if script.delay:
                    await asyncio.sleep(script.delay)
                yield delta
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled.append(request)
            raise
        if script.fail_after is not None:
            raise script.error

    async def _play(self, script: Script, request: GenerationRequest) -> list[Delta]:
        if callable(script.deltas):
            produced = script.deltas(request)
            if inspect.isawaitable(produced):
                produced = await produced
            deltas = list(produced)
        else:
            deltas = list(script.deltas)
        usage = Usage(
            input_tokens=_input_words(request),
            output_tokens=sum(isinstance(d, (TextDelta, ReasoningDelta, ToolCallDelta)) for d in deltas),
        )
        if not any(isinstance(delta, Finish) for delta in deltas):
            deltas.append(Finish("stop"))
        return [Finish(d.reason, usage) if isinstance(d, Finish) and d.usage is None else d for d in deltas]


def _input_words(request: GenerationRequest) -> int:
    return sum(len(message.content.split()) for message in request.messages)
