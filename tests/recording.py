"""A real backend with an observer: it records every request, then delegates.

Used where a test must prove what reached the model (the assembled context of a chain,
what truncation kept) while the model itself stays real.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from app.backends.base import Backend, ChatMessage, Delta, GenerationRequest, ModelInfo, ToolSpec


class RecordingBackend(Backend):
    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.requests: list[GenerationRequest] = []

    def models(self) -> list[ModelInfo]:
        return self.inner.models()

    async def available_models(self) -> list[ModelInfo]:
        return await self.inner.available_models()

    def serves(self, model: str) -> bool:
        return self.inner.serves(model)

    async def check(self, request: GenerationRequest) -> None:
        await self.inner.check(request)

    def context_window(self, model: str) -> int | None:
        return self.inner.context_window(model)

    async def count_tokens(
        self, model: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()
    ) -> int | None:
        return await self.inner.count_tokens(model, messages, tools)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        self.requests.append(request)
        stream = self.inner.stream(request)
        try:
            async for delta in stream:
                yield delta
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def start(self) -> None:
        await self.inner.start()

    async def aclose(self) -> None:
        await self.inner.aclose()

    def last_conversation(self) -> list[tuple[str, str]]:
        return [(message.role, message.content) for message in self.requests[-1].messages]
