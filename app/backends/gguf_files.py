"""What a GGUF file says of itself, read with llama.cpp's own ``gguf`` package.

A file an operator brings (the models folder, a config entry) is read once at start: its
header and metadata (memory-mapped, no weights read), to tell a model from a multimodal
projector, to find its trained window and chat template, and to refuse early what
llama.cpp could not load: a file that is not a GGUF, one cut short (its tensors end past
the end of the file), a shard whose siblings are missing. Whether llama.cpp knows the
architecture is only known when its server loads the file (:mod:`app.backends.local`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from app.errors import ModelError

SHARD = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
"""A split GGUF's shard name, as llama.cpp's ``gguf-split`` writes it (numbered from 1)."""
PROJECTOR_PREFIX = "mmproj"
"""A multimodal projector's file name starts with this (llama.cpp's router convention)."""
_UNAVAILABLE = "model_unavailable"


class GgufKind(Enum):
    MODEL = "model"
    PROJECTOR = "projector"
    """A multimodal projector (a vision or audio encoder, architecture ``clip``)."""


@dataclass(frozen=True, slots=True)
class GgufFacts:
    """What a GGUF's header and metadata say."""

    path: Path
    kind: GgufKind
    architecture: str
    context_length: int | None
    """The window the model was trained with (``<architecture>.context_length``)."""
    chat_template: str | None
    """Its own chat template (``tokenizer.chat_template``), if it has one."""
    shards: int = 1
    """How many files the model is split into (``split.count``), this one the first."""


def shard_paths(first: Path) -> list[Path]:
    """Every shard of the split GGUF whose first shard is ``first`` (``[first]`` for a
    file that is not split), whether or not they exist."""
    match = SHARD.match(first.name)
    if match is None:
        return [first]
    count = int(match["count"])
    return [first.with_name(f"{match['stem']}-{no:05d}-of-{count:05d}.gguf") for no in range(1, count + 1)]


def read_facts(path: Path) -> GgufFacts:
    """The facts of the GGUF at ``path``; ``ModelError`` (``model_unavailable``) naming the
    file if it cannot be read, is not a GGUF, is cut short, or misses a shard. Blocking
    (the header of a large vocabulary is megabytes, and the reader parses every tensor's
    entry in Python: 2.5 s for SmolLM2's, 6 s for Qwen's): call it from a worker thread.

    A file read before and unchanged since (the same device, inode, size and modification
    time, and its shards too) is not read again: a model's load checks its file this way,
    so it costs what a built-in model's does (``python -m bench model-load``)."""
    try:
        stamp = _stamp(path)
    except OSError:
        stamp = None
    known = _READ.get(path)
    if stamp is not None and known is not None and known[0] == stamp:
        return known[1]
    facts = _read_facts(path)
    if stamp is not None:
        _READ[path] = (stamp, facts)
    return facts


_READ: dict[Path, tuple[tuple[int, ...], GgufFacts]] = {}
"""The facts of each file read, with the stamp they were read at (:func:`read_facts`)."""


def _stamp(path: Path) -> tuple[int, ...]:
    stamp: list[int] = []
    for part in shard_paths(path):
        if part.exists() or part == path:
            info = part.stat()
            stamp += [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns]
    return tuple(stamp)


def _read_facts(path: Path) -> GgufFacts:
    from gguf import GGUFReader  # numpy and the format's tables: loaded only when a file is read

    try:
        reader = GGUFReader(path)
    except OSError as exc:
        raise _bad(path, f"cannot be read: {exc.strerror or exc}") from None
    except Exception as exc:  # the reader's own ValueError, or numpy's on a file cut inside its header
        raise _bad(path, f"is not a GGUF file llama.cpp can read ({exc})") from None
    size = path.stat().st_size
    ends = [int(tensor.data_offset) + int(tensor.n_bytes) for tensor in reader.tensors]
    if ends and max(ends) > size:
        raise _bad(path, f"is cut short: its tensors end at byte {max(ends):,}, the file has {size:,}")
    architecture = str(_value(reader, "general.architecture") or "")
    if not architecture:
        raise _bad(path, "names no architecture (general.architecture)")
    projector = architecture == "clip" or _value(reader, "general.type") == "mmproj"
    kind = GgufKind.PROJECTOR if projector else GgufKind.MODEL
    context = _value(reader, f"{architecture}.context_length")
    template = _value(reader, "tokenizer.chat_template")
    shards = int(_value(reader, "split.count") or 1)
    if shards > 1:
        missing = [shard.name for shard in shard_paths(path)[1:] if not shard.is_file()]
        if len(shard_paths(path)) != shards or missing:
            raise _bad(path, f"is the first of {shards} shards, and {', '.join(missing) or 'its siblings'} "
                             "cannot be found beside it (names as gguf-split writes them: NAME-00001-of-00003.gguf)")
    return GgufFacts(
        path=path,
        kind=kind,
        architecture=architecture,
        context_length=int(context) if isinstance(context, int) and context > 0 else None,
        chat_template=template if isinstance(template, str) and template.strip() else None,
        shards=shards,
    )


def _value(reader: Any, key: str) -> Any:
    field = reader.get_field(key)
    if field is None:
        return None
    try:
        value = field.contents()
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
    return value.item() if hasattr(value, "item") else value


def _bad(path: Path, why: str) -> ModelError:
    """The error of a file, by its name: the message reaches clients, the folder it lies in
    is the operator's (the log at start names the whole path)."""
    return ModelError(f"The model file {path.name} {why}", code=_UNAVAILABLE)
