"""Small GGUF files written with llama.cpp's own ``gguf`` package, for the tests of what
the server reads from a file's header (the models folder, ``[models.ID]`` entries). They
carry a header and a tensor, not a model llama.cpp could run: the real models' files
serve where a model must answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter


def with_template(source: Path, path: Path, template: str) -> Path:
    """A copy of the GGUF at ``source`` (a real model) at ``path``, with ``template`` as its
    chat template: its weights and vocabulary, another family's chat format."""
    from gguf import GGUFReader, GGUFValueType
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = GGUFReader(source)
    architecture = reader.get_field("general.architecture").contents()  # type: ignore[union-attr]
    writer = GGUFWriter(str(path), architecture, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {"tokenizer.chat_template": MetadataDetails(GGUFValueType.STRING, template)},
                           [])
    return path


def write_gguf(path: Path, architecture: str = "llama", *, context: int | None = 2048,
               template: str | None = "{% for m in messages %}{{ m.content }}{% endfor %}",
               shards: int | None = None, projector: bool = False) -> Path:
    """A GGUF at ``path`` saying what is asked of it (``projector``: a ``clip`` file)."""
    writer = GGUFWriter(str(path), "clip" if projector else architecture)
    if projector:
        writer.add_string("general.type", "mmproj")
    if context is not None and not projector:
        writer.add_context_length(context)
    if template is not None and not projector:
        writer.add_chat_template(template)
    if shards is not None:
        writer.add_uint16("split.count", shards)
    writer.add_tensor("weights", np.zeros((8, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
