"""The models an operator brings: a models folder (``ORS_MODELS_DIR``) and ``[models.ID]``
entries of the configuration file (``ORS_CONFIG``), served by the embedded engine beside
the two built-in models.

The folder is laid out as llama.cpp's router reads its ``--models-dir``::

    models/
      Llama-3.2-1B-Instruct-Q4_K_M.gguf      # served as Llama-3.2-1B-Instruct-Q4_K_M
      gemma-3-4b-it/                         # a folder: served as gemma-3-4b-it
        gemma-3-4b-it-Q8_0.gguf              #   its model
        mmproj-F16.gguf                      #   its projector (a name starting with mmproj)
      Kimi-K2-UD-IQ1_S/                      # a split model in a folder of its own,
        Kimi-K2-UD-IQ1_S-00001-of-00006.gguf #   served from its first shard
        …

A shard set may also lie at the top (``NAME-00001-of-00003.gguf`` is served as ``NAME``);
a projector at the top (``mmproj-NAME.gguf``) goes with the model ``NAME``. Entries name
files anywhere, with what a file cannot say::

    [models.llama3]
    path = "Llama-3.2-1B-Instruct-Q4_K_M.gguf"  # relative to the file's directory
    projector = "mmproj-F16.gguf"               # optional
    context = 8192           # tokens of context; default its trained window, at most 32,768
    parallel = 2             # slots; default ORS_MODEL_PARALLEL
    kv_type = "q8_0"         # default ORS_MODEL_KV_TYPE
    chat_template_file = "llama3.jinja"          # or chat_template = "…": replaces the GGUF's
    aliases = ["llama"]
    temperature = 0.6        # and top_p, top_k, min_p, repeat_penalty: its default sampling
    max_output_tokens = 2048 # an answer's length when a request sets none
    chat_parser = "auto"     # or "llama.cpp", "ors": who reads its calls (chat_parser())

An entry may name a file of the folder: the model is then served under both ids, each
with its own settings (and, once loaded, its own server), and the entry takes the
folder's projector of that model unless it names one; an entry with a folder model's id
replaces it. Every file's header is read at start
(:func:`~app.backends.gguf_files.read_facts`): a file that is not a GGUF, is cut short
or misses a shard is logged once at ERROR and listed with that error, and a request for
it is 503 ``model_unavailable`` naming the file; the other models are served. A mistake
in the entries themselves (an unknown key, a built-in id, a path that does not exist)
is a :class:`ModelsConfigError`, which
``ors serve`` prints and exits with 2.
"""

from __future__ import annotations

import logging
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.backends.gguf_files import PROJECTOR_PREFIX, SHARD, GgufFacts, GgufKind, read_facts
from app.backends.model_files import LOCAL_MODELS, DiskFile, ModelSpec, SamplingDefaults
from app.errors import ModelError

log = logging.getLogger("ors.models")

MAX_DEFAULT_WINDOW = 32_768
"""An operator's model is served with its trained window up to this (Qwen2.5-Coder's):
a model trained on 128k tokens would otherwise reserve gigabytes of KV cache it may
never use. A ``context`` (or ``ORS_MODEL_CONTEXT``) sets another."""
FALLBACK_WINDOW = 4096
"""The window of a model whose file does not say what it was trained with."""
T = TypeVar("T")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}$")


class ModelsConfigError(ValueError):
    """The operator's models cannot be configured as written; the message says where."""


class ModelEntry(BaseModel):
    """One ``[models.ID]`` table."""

    model_config = ConfigDict(extra="forbid", strict=True)

    path: str
    projector: str | None = None
    context: int | None = Field(default=None, ge=256, le=1_048_576)
    parallel: int | None = Field(default=None, ge=1, le=64)
    kv_type: Literal["f16", "q8_0", "q4_0"] | None = None
    chat_template: str | None = None
    chat_template_file: str | None = None
    aliases: list[str] = Field(default_factory=list)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, gt=0)
    max_output_tokens: int | None = Field(default=None, ge=1)
    chat_parser: Literal["auto", "llama.cpp", "ors"] = "auto"


class ModelsFile(BaseModel):
    """The part of ``ORS_CONFIG`` read here (the upstreams are read elsewhere)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    models: dict[str, ModelEntry] = Field(default_factory=dict)


@dataclass(frozen=True)
class OperatorModels:
    """What the folder and the entries add to the built-in models."""

    specs: dict[str, ModelSpec] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    """The entries' aliases, each to its entry's id."""


def operator_models(models_dir: Path | None, config: Path | None) -> OperatorModels:
    """The models of ``models_dir`` and of the ``[models]`` entries of ``config`` (an
    entry's id replaces a folder model's of the same name). Reads
    every file's header: blocking, seconds for a large vocabulary; call it off the loop."""
    specs = folder_models(models_dir) if models_dir is not None else {}
    aliases: dict[str, str] = {}
    if config is not None:
        for spec, names in _entry_models(config, specs):
            specs[spec.id] = spec
            aliases |= {name: spec.id for name in names}
    for spec in specs.values():
        if spec.problem is not None and isinstance(spec.source, DiskFile):
            log.error("model '%s' cannot be served (%s): %s", spec.id, spec.source.path, spec.problem)
    return OperatorModels(specs, aliases)


def folder_models(directory: Path) -> dict[str, ModelSpec]:
    """The models of a models folder (see the module docstring), by id."""
    if not directory.is_dir():
        raise ModelsConfigError(f"ORS_MODELS_DIR {directory}: not a directory")
    found: dict[str, tuple[Path, Path | None]] = {}
    top = sorted(path for path in directory.glob("*.gguf") if path.is_file())
    projectors = {path for path in top if path.name.startswith(PROJECTOR_PREFIX)}
    for path in top:
        if path in projectors:
            continue
        if not _first_shard(path):
            continue
        shard = SHARD.match(path.name)
        model = shard["stem"] if shard is not None else path.stem
        companion = directory / f"{PROJECTOR_PREFIX}-{model}.gguf"
        found[model] = (path, companion if companion in projectors else None)
    for folder in sorted(path for path in directory.iterdir() if path.is_dir() and not path.name.startswith(".")):
        files = sorted(path for path in folder.glob("*.gguf") if path.is_file())
        weights = [path for path in files if not path.name.startswith(PROJECTOR_PREFIX) and _first_shard(path)]
        projector = next((path for path in files if path.name.startswith(PROJECTOR_PREFIX)), None)
        if len(weights) == 1:
            found[folder.name] = (weights[0], projector)
        elif weights:
            log.error("models folder %s holds %d models (%s); a model's folder holds one (with its shards "
                      "and projector): none of them is served", folder, len(weights),
                      ", ".join(path.name for path in weights))
    specs = {}
    for model, (path, projector) in found.items():
        if model in LOCAL_MODELS or not _ID.match(model):
            log.warning("models folder: %s is not served: %r is %s", path, model,
                        "a built-in model's id" if model in LOCAL_MODELS else "not a usable model id")
            continue
        specs[model] = disk_model(model, path, projector)
    return specs


def disk_model(model: str, path: Path, projector: Path | None = None, entry: ModelEntry | None = None,
               template: str | None = None) -> ModelSpec:
    """The spec of the model in the file at ``path`` (with what ``entry`` says); a file
    that cannot be served gives a spec with its :attr:`~ModelSpec.problem`."""
    entry = entry or ModelEntry(path=str(path))
    source = DiskFile(path, projector)
    try:
        facts = read_facts(path)
        if facts.kind is GgufKind.PROJECTOR:
            raise ModelError(f"The model file {path.name} is a multimodal projector, not a model")
        if projector is not None and read_facts(projector).kind is not GgufKind.PROJECTOR:
            raise ModelError(f"The projector file {projector.name} of model '{model}' is not a multimodal projector")
    except ModelError as exc:
        return ModelSpec(id=model, source=source, problem=exc.message)
    template = template or facts.chat_template
    defaults = SamplingDefaults()
    return ModelSpec(
        id=model,
        source=source,
        context_window=entry.context or _default_window(facts),
        template_renders_tools=bool(template and re.search(r"\btools\b", template)),
        sampling=SamplingDefaults(
            temperature=_given(entry.temperature, defaults.temperature),
            top_p=_given(entry.top_p, defaults.top_p),
            top_k=_given(entry.top_k, defaults.top_k),
            min_p=_given(entry.min_p, defaults.min_p),
            repeat_penalty=_given(entry.repeat_penalty, defaults.repeat_penalty),
        ),
        default_max_output_tokens=entry.max_output_tokens,
        notes=f"{facts.architecture} model from {path}" + (f" (in {facts.shards} shards)" if facts.shards > 1 else ""),
        chat_template=template if template != facts.chat_template else None,
        parallel=entry.parallel,
        kv_type=entry.kv_type,
        chat_parser=chat_parser(entry.chat_parser, template),
        context_configured=entry.context is not None,
    )


def chat_parser(choice: Literal["auto", "llama.cpp", "ors"], template: str | None) -> Literal["ors", "llama.cpp"]:
    """Who renders a model's chats and reads its calls and reasoning. ``auto``: this
    server for a template whose calls are Hermes's ``<tool_call>`` JSON without
    ``<think>`` reasoning (Qwen2.5, Hermes: the built-in models' form, with their
    grammars; llama.cpp's server forces no call of that form when one is required), and
    llama.cpp's server for every other (Llama 3.x JSON calls, Qwen3's XML calls, Mistral's
    ``[TOOL_CALLS]``, ``<think>`` reasoning), whose parsers know each family."""
    if choice != "auto":
        return choice
    hermes = template is not None and "<tool_call>" in template
    return "ors" if hermes and "<function=" not in template and "<think>" not in template else "llama.cpp"


def _entry_models(config: Path, folder: dict[str, ModelSpec]) -> list[tuple[ModelSpec, list[str]]]:
    where = f"ORS_CONFIG {config}"
    try:
        raw = tomllib.loads(config.read_text(encoding="utf-8"))
        parsed = ModelsFile.model_validate(raw)
    except OSError as exc:
        raise ModelsConfigError(f"{where}: cannot be read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ModelsConfigError(f"{where}: not valid TOML: {exc}") from None
    except ValidationError as exc:
        problem = exc.errors()[0]
        location = ".".join(str(part) for part in problem["loc"])
        raise ModelsConfigError(f"{where}: {location}: {problem['msg']}") from None
    models = []
    taken: set[str] = set(LOCAL_MODELS)
    for model, entry in parsed.models.items():
        at = f"{where}: models.{model}"
        if not _ID.match(model):
            raise ModelsConfigError(f"{at}: a model id is 1-128 letters, digits, '_', '.', ':', '+' or '-'")
        names = [model, *entry.aliases]
        clash = next((name for name in names if name in taken), None)
        if clash is not None:
            raise ModelsConfigError(f"{at}: {clash!r} is already the id or alias of another model")
        taken |= set(names)
        path = _file(config.parent, entry.path, f"{at}.path")
        projector = _file(config.parent, entry.projector, f"{at}.projector") if entry.projector else None
        if projector is None:
            projector = next((spec.source.projector for spec in folder.values()
                              if isinstance(spec.source, DiskFile) and spec.source.path == path), None)
        if entry.chat_template is not None and entry.chat_template_file is not None:
            raise ModelsConfigError(f"{at}.chat_template_file: give either 'chat_template' or 'chat_template_file'")
        template = entry.chat_template
        if entry.chat_template_file is not None:
            template_path = _file(config.parent, entry.chat_template_file, f"{at}.chat_template_file")
            template = template_path.read_text(encoding="utf-8")
        models.append((disk_model(model, path, projector, entry, template), entry.aliases))
    return models


def _first_shard(path: Path) -> bool:
    """Whether ``path`` is a model's only file or its first shard."""
    shard = SHARD.match(path.name)
    return shard is None or int(shard["no"]) == 1


def _file(directory: Path, name: str, where: str) -> Path:
    path = directory / Path(name).expanduser()  # an absolute path stays as it is
    if not path.is_file():
        raise ModelsConfigError(f"{where}: {path} is not a file")
    return path


def _default_window(facts: GgufFacts) -> int:
    return min(facts.context_length or FALLBACK_WINDOW, MAX_DEFAULT_WINDOW)


def _given(value: T | None, default: T) -> T:
    return default if value is None else value
