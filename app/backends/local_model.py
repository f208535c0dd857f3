"""One embedded model as it runs: its vocabulary here, its llama-server there, its slots;
and the entry that holds it while it loads, runs or has failed to load."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from enum import Enum

from app.backends.chat_completions import ChatCompletionsBackend
from app.backends.http_client import Timeouts
from app.backends.llama_server import LlamaServer
from app.backends.model_files import ModelSpec
from app.backends.slots import SlotPool
from app.backends.vocabulary import Vocabulary
from app.errors import ORSError

log = logging.getLogger("ors.local")


class ModelStatus(Enum):
    """Where a served model is, as ``/v1/models`` lists it (llama.cpp's router's words)."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    ERROR = "error"
    """Its file cannot be served, or its last load failed (the next request tries again)."""


CHAT_READ_SECONDS = 3600.0
"""How long the chat endpoint of a model's own llama-server may stay silent: a long prompt
evaluates for minutes before the first chunk (a stuck server is found by its supervisor)."""


class LocalModel:
    """A loaded model: its vocabulary here, its llama-server there, and its slots; for a
    model whose server reads its chats (``ModelSpec.chat_parser``), the Chat Completions
    adapter that speaks to that server's chat endpoint."""

    def __init__(self, spec: ModelSpec, vocabulary: Vocabulary, server: LlamaServer, slots: SlotPool) -> None:
        self.spec = spec
        self.vocabulary = vocabulary
        self.server = server
        self.slots = slots
        self.context_window = server.options.context
        self.chat: ChatCompletionsBackend | None = None
        if server.options.chat:
            self.chat = ChatCompletionsBackend(server.base_url + "/v1", headers=server.headers, owned_by="ors",
                                               timeout=Timeouts(read=CHAT_READ_SECONDS), named_tool_choice=False,
                                               replay_reasoning=True, input_modalities=("text",))

    def chat_endpoint(self) -> ChatCompletionsBackend:
        """The adapter to this model's chat endpoint, at the server's current port (a
        server started again after an exit listens on another)."""
        assert self.chat is not None, "a model whose prompts are rendered here has no chat endpoint"
        self.chat.base_url = self.server.base_url + "/v1"
        return self.chat

    async def save(self) -> None:
        """Save every slot that holds something (``slot-<i>.bin``); a file of a slot that
        is empty now is removed, so a restart does not restore what is gone."""
        names = slot_files(self.slots.size)
        saved = await self.server.save_slots(names)
        for slot, name in names.items():
            if slot not in saved:
                with contextlib.suppress(OSError):
                    (self.server.options.slot_dir / name).unlink()

    async def restore(self) -> None:
        """Restore the slots saved by :meth:`save` at the last shutdown."""
        restored = await self.server.restore_slots(slot_files(self.slots.size))
        if restored:
            log.info("restored the prompt cache of %s: %d slot(s)", self.spec.id, len(restored))

    async def close(self) -> None:
        with contextlib.suppress(ORSError, OSError):
            if self.server.running:
                await self.save()
        await self.server.stop()
        if self.chat is not None:
            await self.chat.aclose()
        self.vocabulary.close()


def slot_files(slots: int) -> dict[int, str]:
    return {slot: f"slot-{slot}.bin" for slot in range(slots)}


class ServedModel:
    """One served model id: its spec, the model once started, and who holds it (the
    leases of :mod:`app.backends.residency`)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.model: LocalModel | None = None
        self.loading: asyncio.Future[LocalModel] | None = None
        self.unloading: asyncio.Future[None] | None = None
        """Set while its server saves its slots and stops; a load waits for it."""
        self.failure: str | None = spec.problem
        """Why its last load failed (or why its file cannot be served), until one succeeds."""
        self.holders = 0
        """Requests that hold it now, from before its load to the end of their streams."""
        self.last_used = time.monotonic()
        self.reserved_mib = 0
        """Its footprint while loading or loaded (0 unloaded), counted against the budget."""

    @property
    def idle(self) -> bool:
        """Loaded, and held by nobody: the only state in which it may be unloaded."""
        return self.model is not None and self.holders == 0 and self.unloading is None

    @property
    def status(self) -> ModelStatus:
        if self.model is not None and self.unloading is None:
            return ModelStatus.LOADED
        if self.loading is not None:
            return ModelStatus.LOADING
        return ModelStatus.ERROR if self.failure is not None else ModelStatus.UNLOADED
