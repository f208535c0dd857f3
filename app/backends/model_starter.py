"""How one embedded model starts: its file verified, its vocabulary loaded, its place in
the memory budget taken, and its llama-server started with the model's own options (for a
model whose server reads its chats, :attr:`ModelSpec.chat_parser`: the Jinja engine, a
template override and the model's default sampling as flags)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from app.backends.gguf_files import shard_paths
from app.backends.llama_process import DEFAULT_CHUNK, ServerOptions, find_binary
from app.backends.llama_server import HANG_SECONDS, LlamaServer
from app.backends.local_model import LocalModel, ServedModel
from app.backends.model_files import DiskFile, ModelFiles, ModelSpec
from app.backends.residency import footprint_mib
from app.backends.slots import SlotPool
from app.backends.vocabulary import Vocabulary
from app.errors import ModelError, ModelUnavailable, ORSError

UNLOADABLE_RETRY_SECONDS = 60
"""``Retry-After`` of a request for an operator's model that failed to load: it is tried
again at the next request, which finds the file mended or the same error."""

Admit = Callable[[ServedModel, int], Awaitable[None]]


class ModelStarter:
    """Starts models with the backend's options (see ``LocalBackend``'s); a model's own
    ``parallel`` and ``kv_type`` win over them."""

    def __init__(self, data_dir: Path, files: ModelFiles, *, threads: int | None, parallel: int, queue: int,
                 cache_ram_mib: int, kv_type: str, chunk: int = DEFAULT_CHUNK, server_binary: str | None = None,
                 hang_seconds: float = HANG_SECONDS) -> None:
        self.data_dir = data_dir
        self.files = files
        self.threads = threads or _available_cpus()
        self.parallel = parallel
        self.queue = queue
        self.cache_ram_mib = cache_ram_mib
        self.kv_type = kv_type
        self.chunk = chunk
        self.server_binary = server_binary
        self.hang_seconds = hang_seconds

    def _template_file(self, spec: ModelSpec) -> Path | None:
        """The file of a chat template that replaces the GGUF's own, for a server that
        renders its chats (written afresh at each load)."""
        if spec.chat_template is None or spec.chat_parser != "llama.cpp":
            return None
        path = self.data_dir / "templates" / f"{spec.id}.jinja"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(spec.chat_template, encoding="utf-8")
        return path

    async def start(self, entry: ServedModel, context: int, admit: Admit) -> LocalModel:
        """The entry's model, started with a window of ``context`` tokens, once ``admit``
        (the budget) has taken its footprint."""
        spec = entry.spec
        operators = isinstance(spec.source, DiskFile)
        try:
            path = await asyncio.to_thread(self.files.path, spec.id)
            vocabulary = await asyncio.to_thread(Vocabulary, spec, path)
        except ORSError as exc:
            if operators:  # the operator's file: not this server's fault, and tried again at the next request
                raise ModelUnavailable(exc.message, retry_after=UNLOADABLE_RETRY_SECONDS) from exc
            raise
        except Exception as exc:
            if not isinstance(spec.source, DiskFile):
                raise ModelError(f"The model '{spec.id}' failed to load: {exc}") from exc
            raise ModelUnavailable(f"The model '{spec.id}' failed to load from {spec.source.path.name}: {exc}",
                                   retry_after=UNLOADABLE_RETRY_SECONDS) from exc
        parallel = spec.parallel or self.parallel
        kv_type = spec.kv_type or self.kv_type
        try:
            need = footprint_mib(vocabulary.llm.metadata, sum(part.stat().st_size for part in shard_paths(path)),
                                 context, kv_type)
            await admit(entry, need)
        except BaseException:
            vocabulary.close()
            raise
        template_file = await asyncio.to_thread(self._template_file, spec)
        options = ServerOptions(
            model_path=path,
            context=context,
            parallel=parallel,
            threads=self.threads,
            cache_ram_mib=self.cache_ram_mib,
            slot_dir=self.data_dir / "kv" / spec.id,
            kv_type=kv_type,
            batch=self.chunk,
            chat=spec.chat_parser == "llama.cpp",
            chat_template_file=template_file,
            defaults=default_flags(spec) if spec.chat_parser == "llama.cpp" else (),
        )
        server = LlamaServer(find_binary(self.server_binary), options, self.data_dir / "logs" / f"{spec.id}.log",
                             hang_seconds=self.hang_seconds)
        try:
            await server.start()
        except BaseException:
            vocabulary.close()
            raise
        model = LocalModel(spec, vocabulary, server, SlotPool(parallel, self.queue))
        await model.restore()
        server.on_restart = model.restore  # a server started again after an exit gets them back too
        return model


def default_flags(spec: ModelSpec) -> tuple[str, ...]:
    """llama-server's flags of ``spec``'s default sampling and answer length."""
    sampling = spec.sampling
    flags = ["--temp", str(sampling.temperature), "--top-p", str(sampling.top_p), "--top-k", str(sampling.top_k),
             "--min-p", str(sampling.min_p), "--repeat-penalty", str(sampling.repeat_penalty)]
    if spec.default_max_output_tokens is not None:
        flags += ["--n-predict", str(spec.default_max_output_tokens)]
    return tuple(flags)


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1

