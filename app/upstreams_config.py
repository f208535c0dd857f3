"""The upstreams: the configuration file (``ORS_CONFIG``) and the ``ORS_UPSTREAM_*`` shortcut.

The file is TOML, read with the standard library's ``tomllib`` and validated strictly
(pydantic, unknown keys refused, no type coercion)::

    [upstreams.alpha]
    base_url = "http://127.0.0.1:11434/v1"
    api_key = "…"              # optional; or api_key_env = "NAME" (read at start)
    wire_api = "chat"          # or "responses"
    models = ["alpha-model"]   # exact ids routed here
    prefixes = ["alpha/"]      # ids starting with one of these
    strip_prefix = true        # alpha/llama3 reaches the upstream as llama3 (the default)
    list_models = false        # /v1/models also lists what the upstream's GET /models says
    ca_bundle = "ca.pem"       # https only: trust these CAs for it (PEM), not the system's
    client_cert = "ors.pem"    # https only: a client certificate (mutual TLS), and its
    client_key = "ors.key"     # unencrypted key unless client_cert holds it too
    input_modalities = ["text", "image"]   # the default; ["text"]: images and files reach
                               # its models as markers and text, as for an embedded model
    [upstreams.alpha.model_input_modalities]
    "alpha-model" = ["text"]   # a model that takes other than the upstream's, by the id it is sent
    [upstreams.alpha.dialect]
    replay_reasoning = true    # the wire adapter's dialect options, by their names in code

The dialect options are those of the adapter the ``wire_api`` selects
(:class:`~app.backends.chat_completions.ChatDialect`,
:class:`~app.backends.responses_upstream.ResponsesDialect`); any other name is refused.
``input_modalities`` says what its models take: with ``"image"`` (the default), a
message's images (and files, where the wire API carries them) go as the client sent them
(:mod:`app.backends.parts`), and ``/v1/models`` and the Codex catalog say the models take
images; ``model_input_modalities`` declares a model's own, by the id the upstream is sent
(a prefix stripped). An upstream must route something (``models`` or ``prefixes``); the empty prefix ``""``
routes every id nothing else claims. Routing precedence is :mod:`app.engine.models`'.
The TLS files' paths are relative to the file's directory; they are read at load (a file
that is missing, unreadable, not PEM, or an encrypted key, stops the load), and apply to
an ``https`` base URL only.

``ORS_UPSTREAM_URL`` (with ``ORS_UPSTREAM_API_KEY`` and ``ORS_UPSTREAM_MODELS``) stays the
one-upstream shortcut: a Chat Completions upstream named ``upstream`` that takes the ids
of ``ORS_UPSTREAM_MODELS``, or every id nothing else claims (the empty prefix), and whose
``/v1/models`` entries come from the upstream. It may be combined with a file, as long as
the two do not claim the same id or prefix.

Every problem is a :class:`UpstreamsConfigError` (a ``ValueError``, which ``ors serve``
prints and exits with 2) naming the file, the upstream and the field.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from app.backends.base import TEXT_AND_IMAGES, InputModality
from app.backends.chat_completions import ChatDialect
from app.backends.http_client import TlsFiles, TlsFilesError
from app.backends.responses_upstream import ResponsesDialect

WireApi = Literal["chat", "responses"]
Dialect = ChatDialect | ResponsesDialect
DIALECTS: dict[str, type[ChatDialect] | type[ResponsesDialect]] = {"chat": ChatDialect, "responses": ResponsesDialect}
"""The dialect options of each wire API: the adapters' own dataclasses."""
SHORTCUT_NAME = "upstream"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class UpstreamsConfigError(ValueError):
    """The upstreams cannot be configured as written; the message says where and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class UpstreamEntry(_Strict):
    """One ``[upstreams.NAME]`` table."""

    base_url: str
    api_key: str | None = None
    api_key_env: str | None = None
    wire_api: WireApi = "chat"
    models: list[str] = Field(default_factory=list)
    prefixes: list[str] = Field(default_factory=list)
    strip_prefix: bool = True
    list_models: bool = False
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    dialect: dict[str, Any] = Field(default_factory=dict)
    input_modalities: list[InputModality] = Field(default_factory=lambda: list(TEXT_AND_IMAGES))
    model_input_modalities: dict[str, list[InputModality]] = Field(default_factory=dict)

    @field_validator("input_modalities")
    @classmethod
    def _modalities(cls, value: list[InputModality]) -> list[InputModality]:
        return _modalities(value)

    @field_validator("model_input_modalities")
    @classmethod
    def _models_modalities(cls, value: dict[str, list[InputModality]]) -> dict[str, list[InputModality]]:
        for model, taken in value.items():
            try:
                _modalities(taken)
            except ValueError as exc:
                raise ValueError(f"{model!r}: {exc}") from None
        return value

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        try:
            url = httpx.URL(value)
        except httpx.InvalidURL as exc:
            raise ValueError(f"not a URL: {exc}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"must be an http(s) URL with a host, got {value!r}")
        return value

    @field_validator("models")
    @classmethod
    def _model_ids(cls, value: list[str]) -> list[str]:
        if any(not name.strip() for name in value):
            raise ValueError("model ids must not be empty")
        return value


def _modalities(value: list[InputModality]) -> list[InputModality]:
    if "text" not in value:
        raise ValueError('must include "text": every model takes text')
    if len(set(value)) != len(value):
        raise ValueError("names a modality twice")
    return value


class UpstreamsFile(_Strict):
    upstreams: dict[str, UpstreamEntry] = Field(default_factory=dict)
    models: dict[str, Any] = Field(default_factory=dict)
    """The operator's models, read by :mod:`app.models_config`."""


@dataclass(frozen=True)
class UpstreamSpec:
    """One upstream, ready to be built: what the file (or the shortcut) says, resolved."""

    name: str
    base_url: str
    api_key: str | None
    wire_api: WireApi
    dialect: Dialect
    models: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    strip_prefix: bool = True
    list_models: bool = False
    tls: TlsFiles | None = None
    """The upstream's own CA bundle and client certificate, checked at load."""
    input_modalities: tuple[InputModality, ...] = TEXT_AND_IMAGES
    """What its models take (``Backend.input_modalities``)."""
    model_input_modalities: dict[str, tuple[InputModality, ...]] = dataclasses.field(default_factory=dict)
    """What some of its models take instead, by the id the upstream is sent."""


def load_upstreams(path: Path, environ: typing.Mapping[str, str] | None = None) -> list[UpstreamSpec]:
    """The upstreams of the file at ``path`` (``api_key_env`` read from ``environ``,
    the process environment by default)."""
    environ = os.environ if environ is None else environ
    where = f"ORS_CONFIG {path}"
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UpstreamsConfigError(f"{where}: cannot be read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UpstreamsConfigError(f"{where}: not valid TOML: {exc}") from None
    try:
        parsed = UpstreamsFile.model_validate(raw)
    except ValidationError as exc:
        raise UpstreamsConfigError(f"{where}: {_first_problem(exc)}") from None
    specs = []
    for name, entry in parsed.upstreams.items():
        field = f"upstreams.{name}"
        if not _NAME.match(name):
            raise UpstreamsConfigError(f"{where}: {field}: an upstream name is 1-64 letters, digits, '_', '.' or '-'")
        specs.append(_spec(name, entry, environ, f"{where}: {field}", path.parent))
    return specs


def _spec(name: str, entry: UpstreamEntry, environ: typing.Mapping[str, str], where: str,
          directory: Path) -> UpstreamSpec:
    if not entry.models and not entry.prefixes:
        raise UpstreamsConfigError(f"{where}: routes nothing: give 'models' (exact ids) or 'prefixes' "
                                   "(the empty prefix \"\" routes every id nothing else claims)")
    if entry.api_key is not None and entry.api_key_env is not None:
        raise UpstreamsConfigError(f"{where}.api_key_env: give either 'api_key' or 'api_key_env', not both")
    api_key = entry.api_key
    if entry.api_key_env is not None:
        api_key = environ.get(entry.api_key_env)
        if not api_key:
            raise UpstreamsConfigError(f"{where}.api_key_env: the environment variable "
                                       f"{entry.api_key_env!r} is not set")
    return UpstreamSpec(
        name=name,
        base_url=entry.base_url,
        api_key=api_key,
        wire_api=entry.wire_api,
        dialect=_dialect(entry.wire_api, entry.dialect, f"{where}.dialect"),
        models=tuple(entry.models),
        prefixes=tuple(entry.prefixes),
        strip_prefix=entry.strip_prefix,
        list_models=entry.list_models,
        tls=_tls(entry, directory, where),
        input_modalities=tuple(entry.input_modalities),
        model_input_modalities={model: tuple(taken) for model, taken in entry.model_input_modalities.items()},
    )


def _tls(entry: UpstreamEntry, directory: Path, where: str) -> TlsFiles | None:
    """The entry's TLS files (relative to ``directory``), each read and checked now."""
    named = {"ca_bundle": entry.ca_bundle, "client_cert": entry.client_cert, "client_key": entry.client_key}
    given = [field for field, value in named.items() if value is not None]
    if not given:
        return None
    if not entry.base_url.lower().startswith("https:"):
        raise UpstreamsConfigError(f"{where}.{given[0]}: TLS files apply to an https base_url only, "
                                   f"and this one is {entry.base_url!r}")
    files = TlsFiles(**{field: directory / Path(value).expanduser() if value is not None else None  # absolute stays
                        for field, value in named.items()})
    try:
        files.context()
    except TlsFilesError as exc:
        raise UpstreamsConfigError(f"{where}.{exc.field}: {exc}") from None
    return files


def _dialect(wire_api: WireApi, options: dict[str, Any], where: str) -> Dialect:
    kind = DIALECTS[wire_api]
    try:
        checked = _dialect_model(kind).model_validate(options)
    except ValidationError as exc:
        error = exc.errors()[0]
        known = ", ".join(f.name for f in dataclasses.fields(kind)) or "none"
        if error["type"] == "extra_forbidden":
            raise UpstreamsConfigError(f"{where}.{error['loc'][0]}: not a dialect option of wire_api "
                                       f"{wire_api!r} (known: {known})") from None
        raise UpstreamsConfigError(f"{where}: {_first_problem(exc)}") from None
    return kind(**checked.model_dump())


def _dialect_model(kind: type[Any]) -> type[BaseModel]:
    """A strict pydantic model with the fields of a dialect dataclass: the adapter's
    dataclass stays the one list of its options."""
    hints = typing.get_type_hints(kind)
    fields: dict[str, Any] = {f.name: (hints[f.name], f.default) for f in dataclasses.fields(kind)}
    return create_model(f"{kind.__name__}Options", __base__=_Strict, **fields)


def shortcut_upstream(url: str, api_key: str | None, models: typing.Sequence[str]) -> UpstreamSpec:
    """The ``ORS_UPSTREAM_*`` variables as an upstream (see the module docstring)."""
    return UpstreamSpec(
        name=SHORTCUT_NAME,
        base_url=url,
        api_key=api_key,
        wire_api="chat",
        dialect=ChatDialect(),
        models=tuple(models),
        prefixes=() if models else ("",),
        list_models=True,
    )


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    location = ".".join(str(part) for part in error["loc"])
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    return f"{location}: {message}" if location else message
