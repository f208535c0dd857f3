"""Which embedded models are loaded: a memory budget, and an idle timeout.

The contract, with :class:`~app.backends.local_model.ServedModel` as the record of one model:

* **Leases.** A request holds its model from before the model is loaded to the end of its
  stream (``holders``); the lease's end stamps ``last_used`` and wakes the idle timer. A
  model is *idle* when it is loaded and nobody holds it. Only an idle model is ever
  unloaded, so nothing a request was promised disappears under it.
* **Unloading** saves the model's slots (its prompt cache comes back at the next load)
  and stops its llama-server. Meanwhile ``unloading`` is set: a request that arrives
  then waits for it and loads the model again.
* **The budget** (``ORS_MODEL_MEMORY_MIB``). A load learns its model's footprint
  (:func:`footprint_mib`: the weights' file, and the KV cache its window needs at its KV
  type) before its server starts, and is admitted under one lock: while the loaded and
  loading models' footprints and this one exceed the budget, the least recently used
  idle model is unloaded; when no idle model is left, 503 ``model_unavailable`` with
  ``Retry-After``: a model in use frees its memory only once it is idle.
* **The idle timeout** (``ORS_MODEL_IDLE_SECONDS``). One task sleeps until the earliest
  moment an idle model reaches it, or until a lease ends or a model loads, and unloads
  what has been idle that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping

from app.backends.local_model import LocalModel, ServedModel
from app.errors import ModelUnavailable, ORSError

log = logging.getLogger("ors.local")

KV_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
"""Bytes of one KV cache element at each KV type (ggml's block sizes)."""
OVERHEAD_MIB = 128
"""Compute buffers and the server itself, beside weights and KV cache (a small model's
llama-server measured about 100 MiB of them)."""
BUSY_RETRY_SECONDS = 5
"""``Retry-After`` when the budget is held by models in use: a response takes seconds."""

Load = Callable[[ServedModel], Awaitable[LocalModel]]


class NoRoom(ModelUnavailable):
    """A load refused by the budget: no fault of the model, and gone once one is idle."""


def footprint_mib(metadata: Mapping[str, str], file_bytes: int, context: int, kv_type: str) -> int:
    """The memory a model takes when loaded: its weights (the size of its file), and a KV
    cache of ``context`` tokens at ``kv_type`` for every layer, from the GGUF's own
    hyperparameters (``metadata``: llama.cpp's, as strings); a file that does not say
    counts its weights only."""
    arch = metadata.get("general.architecture", "")

    def number(key: str, default: float = 0.0) -> float:
        try:
            return float(metadata.get(f"{arch}.{key}", default))
        except ValueError:
            return default

    layers = number("block_count")
    heads = number("attention.head_count")
    heads_kv = number("attention.head_count_kv", heads)
    width = number("embedding_length")
    head_size = width / heads if heads else 0.0
    key_size, value_size = number("attention.key_length", head_size), number("attention.value_length", head_size)
    kv = context * layers * heads_kv * (key_size + value_size) * KV_BYTES.get(kv_type, 2.0)
    return math.ceil((file_bytes + kv) / 2**20) + OVERHEAD_MIB


class Residency:
    """The leases, loads, unloads, budget and idle timer of one backend's models (see the
    module docstring). ``load`` starts one model (the backend's own), which calls
    :meth:`admit` once it knows the model's footprint."""

    def __init__(self, models: Iterable[ServedModel], load: Load, *, memory_mib: int | None = None,
                 idle_seconds: float = 0) -> None:
        self.models = list(models)
        self.memory_mib = memory_mib
        self.idle_seconds = idle_seconds
        self._load = load
        self._admission = asyncio.Lock()
        self._changed = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the idle timer (with an idle timeout)."""
        if self.idle_seconds > 0 and self._timer is None:
            self._timer = asyncio.create_task(self._expire(), name="ors-model-idle")

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None

    def changed(self) -> None:
        """A lease ended or a model loaded: the idle timer looks again."""
        self._changed.set()

    def held_mib(self, besides: ServedModel | None = None) -> int:
        """The footprints of the models loaded or loading (but ``besides``)."""
        return sum(entry.reserved_mib for entry in self.models if entry is not besides)

    async def admit(self, entry: ServedModel, need_mib: int) -> None:
        """Reserve ``need_mib`` for ``entry``'s load, unloading idle models, least recently
        used first, while the budget would be exceeded; 503 when none is left to unload."""
        async with self._admission:
            if self.memory_mib is not None:
                while self.held_mib(entry) + need_mib > self.memory_mib:
                    idle = [other for other in self.models if other is not entry and other.idle]
                    if not idle:
                        raise NoRoom(
                            f"The model '{entry.spec.id}' needs about {need_mib:,} MiB, and "
                            f"{self.held_mib(entry):,} MiB of the {self.memory_mib:,} MiB for models "
                            "(ORS_MODEL_MEMORY_MIB) are held by models in use; try again when one is idle",
                            retry_after=BUSY_RETRY_SECONDS,
                        )
                    victim = min(idle, key=lambda other: other.last_used)
                    log.info("unloading model '%s' (idle since %.0f s) to make room for '%s'", victim.spec.id,
                             time.monotonic() - victim.last_used, entry.spec.id)
                    await self.unload(victim)
            entry.reserved_mib = need_mib

    @contextlib.asynccontextmanager
    async def lease(self, entry: ServedModel) -> AsyncIterator[LocalModel]:
        """The entry's model, loaded, held until the block ends (it is not unloaded meanwhile)."""
        entry.holders += 1
        try:
            yield await self.loaded(entry)
        finally:
            entry.holders -= 1
            entry.last_used = time.monotonic()
            self.changed()

    async def loaded(self, entry: ServedModel) -> LocalModel:
        """The entry's model, started once; a cancelled waiter does not cancel the start."""
        while entry.unloading is not None:
            await asyncio.shield(entry.unloading)
        if entry.model is not None:
            return entry.model
        if entry.loading is None:
            entry.loading = asyncio.ensure_future(self._load(entry))
        loading = entry.loading
        try:
            entry.model = await asyncio.shield(loading)
        except NoRoom:
            if entry.loading is loading:
                entry.loading, entry.reserved_mib = None, 0
            raise
        except ORSError as exc:
            if entry.loading is loading:
                if exc.message != entry.failure:  # once per cause, not once per request
                    log.error("model '%s' cannot be loaded: %s", entry.spec.id, exc.message)
                entry.loading, entry.failure, entry.reserved_mib = None, exc.message, 0
            raise
        entry.loading, entry.failure = None, None
        return entry.model

    async def unload(self, entry: ServedModel) -> None:
        """Save an idle model's slots and stop its server."""
        model, entry.model = entry.model, None
        if model is None:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry.unloading = done
        try:
            await model.close()
            log.info("unloaded model '%s'", entry.spec.id)
        finally:
            entry.unloading, entry.reserved_mib = None, 0
            done.set_result(None)

    async def _expire(self) -> None:
        while True:
            now = time.monotonic()
            idle = [entry for entry in self.models if entry.idle]
            due = [entry for entry in idle if now - entry.last_used >= self.idle_seconds]
            for entry in due:
                log.info("unloading model '%s': unused for %.0f s (ORS_MODEL_IDLE_SECONDS)", entry.spec.id,
                         now - entry.last_used)
                async with self._admission:
                    if entry.idle:
                        await self.unload(entry)
            waits = [entry.last_used + self.idle_seconds - now for entry in idle if entry not in due]
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.1, min(waits)) if waits else None):
                    await self._changed.wait()
