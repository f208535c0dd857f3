"""Settings, from ``ORS_*`` environment variables and command-line flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.backends.http_client import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_KEEPALIVE, DEFAULT_POOL_WAIT
from app.engine.images import DEFAULT_MAX_IMAGE_BYTES
from app.engine.limits import (
    DEFAULT_MAX_INPUT_ITEMS,
    DEFAULT_MAX_JSON_DEPTH,
    DEFAULT_MAX_JSON_VALUES,
    DEFAULT_MAX_TOOLS,
    RequestLimits,
)
from app.schemas import DEFAULT_MAX_SCHEMA_BYTES, DEFAULT_MAX_SCHEMA_DEPTH, SchemaLimits

DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""Room for a 20 MiB image as a base64 data URL (about 27 MiB) plus the rest of a request."""


class Settings(BaseSettings):
    """Everything the server can be told. Build one and pass it to ``create_app``."""

    model_config = SettingsConfigDict(
        env_prefix="ORS_", env_ignore_empty=True, extra="ignore", use_attribute_docstrings=True
    )

    host: str = "127.0.0.1"
    """The address to listen on."""
    port: int = 8080
    """The port to listen on."""
    workers: int = Field(default=1, ge=1, le=64)
    """Worker processes sharing the port. More than 1 needs PostgreSQL (ORS_DATABASE_URL;
    SQLite keeps one writing process) and an upstream, and serves upstream models only:
    the embedded engine batches its requests in one process."""

    default_model: str = DEFAULT_MODEL
    """Used when a request names no model."""
    preload_models: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Local models loaded at start (the default model is always loaded when local)."""
    model_threads: int = 2
    """CPU threads of each embedded model."""
    model_context: int | None = None
    """Tokens of context of each embedded model (shared by its slots; the most one request
    may use); unset means each model's trained window (Qwen2.5-Coder 32,768, SmolLM2 8,192)."""
    model_parallel: int = Field(default=4, ge=1, le=64)
    """Generations an embedded model runs at once, decoded together in one batch per step."""
    model_queue: int = Field(default=32, ge=0)
    """Requests that may wait for a busy embedded model; one more is 429 too_many_requests."""
    model_cache_ram_mib: int = Field(default=2048, ge=0)
    """Host memory (MiB) for prompt caches of idle slots, least recently used out (0: off)."""
    model_kv_type: Literal["f16", "q8_0", "q4_0"] = "f16"
    """The KV cache's type; q8_0 halves its memory at a small cost in quality."""
    model_chunk: int = Field(default=128, ge=16, le=8192)
    """Prompt tokens an embedded model evaluates per step, between two decoding steps of
    the streams already running: the longest a running stream waits for a new prompt."""
    model_hang_seconds: float = Field(default=120.0, ge=0)
    """How long a running embedded model's server may answer nothing (a stuck loop) before
    it is killed and started again; 0: never."""
    llama_server: str | None = None
    """The llama-server executable that runs the embedded models; unset means the one
    ``make install`` built into the virtual environment."""
    model_aliases: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    """Other names for served models, ``alias=model,...`` (e.g. ``gpt-4o-mini=qwen2.5-coder-1.5b-instruct``):
    requests for an alias run on its model and echo the alias; ``/v1/models`` lists them."""

    upstream_url: str | None = None
    """An OpenAI-compatible Chat Completions base URL, e.g. ``http://127.0.0.1:11434/v1``.
    Requests for models that are not local go there."""
    upstream_api_key: SecretStr | None = None
    """The bearer key sent to the upstream."""
    upstream_models: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """If set, only these model ids are routed upstream (others are ``model_not_found``)."""
    upstream_max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, ge=1)
    """Connections each upstream's pool may hold open at once (in use or idle; through a
    proxy, per proxy). A streamed response holds one for its whole life, so this is how
    many responses an upstream may be generating at once for this process; one more waits
    for a connection (see ``upstream_pool_timeout``)."""
    upstream_max_keepalive: int = Field(default=DEFAULT_MAX_KEEPALIVE, ge=0)
    """Idle connections each upstream's pool keeps for reuse (for 4 s at most, less than
    the 5 s after which common servers close them). At least the requests usually in
    flight, or connections are opened again and again."""
    upstream_pool_timeout: float = Field(default=DEFAULT_POOL_WAIT, gt=0)
    """Seconds a request may wait for a connection when all of an upstream's
    ``upstream_max_connections`` are in use: it goes on as soon as one is free (waiting
    is graceful, first come first served); past this it is 429 ``server_busy`` with
    ``Retry-After``."""
    config: Path | None = None
    """A TOML file of named upstreams (Chat Completions or native Responses), each with
    its base URL, key, wire API, exact model ids, id prefixes and dialect options (see
    the README's Upstreams section); the ``upstream_*`` settings stay the one-upstream
    shortcut beside it."""

    data_dir: Path = Path("data")
    """Where the store, the assembled model file and the generated secret key live."""
    database_url: str | None = None
    """SQLAlchemy URL of the store; SQLite under ``data_dir`` when unset."""
    database_wait_seconds: float = Field(default=30.0, ge=0)
    """At start, how long to keep trying a database that cannot be reached (it may start
    after the server, as in a compose file or a pod), once a second; then the server
    exits with the error. 0: do not wait."""

    response_retention_days: float | None = Field(default=None, gt=0)
    """Stored responses are deleted, as ``DELETE`` deletes them, once this many days have
    passed since they were created (finished ones; a conversation's older turns stay in
    the context of its visible later ones). Fractions are allowed. Unset: kept until
    deleted."""

    api_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    """Bearer keys, ``name:secret`` (the tenant is ``name``; several secrets may share it,
    which is how a key is rotated) or a bare secret (the tenant is a keyed digest of it);
    empty means one anonymous tenant. See ``app.transport.auth``."""
    secret_key: SecretStr | None = None
    """Keys for encrypted content, comma-separated, newest first (older ones still
    decrypt); unset means a key generated once in ``data_dir``."""

    rate_limit_rpm: int | None = Field(default=None, ge=1)
    """Requests per minute per tenant (a sliding 60-second window) on the routes that
    generate; one more is 429 ``rate_limit_exceeded`` with ``Retry-After``. Unset: unlimited."""
    rate_limit_concurrent: int | None = Field(default=None, ge=1)
    """Responses in flight per tenant (a stream, a JSON request, a background response, a
    WebSocket turn); one more is 429 ``rate_limit_exceeded``. Unset: unlimited."""
    redis_url: str | None = None
    """Redis that counts the rate limits, so several replicas share each tenant's budget
    (``redis://host:6379/0``). Unset: counted in this process's memory. If Redis cannot be
    reached, requests are let through (fail open) with a warning in the log."""
    redis_prefix: str = "ors"
    """Prefix of the Redis keys, so several deployments can share one Redis."""
    ws_max_connection_seconds: float = 3600.0
    """The lifetime of a WebSocket connection."""

    allow_unauthenticated: bool = False
    """Serve without API keys on an address that is not loopback. Without it (and without
    ``api_keys``) the server refuses to start there."""
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Browser origins (``https://app.example``, or ``*``) that may open WebSocket
    connections and make CORS requests; empty means no CORS, and WebSocket upgrades that
    carry an ``Origin`` are refused (those without one, from SDKs and CLIs, are not)."""
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Host names accepted besides ``localhost``, ``127.0.0.1`` and ``[::1]`` when the server
    listens on a loopback address (a guard against DNS rebinding)."""
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    """The largest request body, and the largest WebSocket message (413 ``request_too_large``)."""
    max_body_bytes_in_flight: int = Field(default=8 * DEFAULT_MAX_BODY_BYTES, ge=0)
    """The bytes of all HTTP request bodies a server process (each worker) holds at once,
    each from its headers until its response is over; a body that would pass it is 429
    ``server_busy`` with ``Retry-After``. At least ``max_body_bytes``; 0: no bound."""
    request_read_timeout: float = Field(default=30.0, ge=0)
    """Seconds a client has to begin a new connection's first request and to complete a
    request's headers, and may go silent while sending its body; past it the connection
    is closed (slow and stalled clients hold no connection). 0: no limit."""
    ws_max_queued_frames: int = Field(default=4, ge=0)
    """``response.create`` frames that may wait behind the running turn of a WebSocket
    connection; each one more gets an error envelope (429, in its turn) and is dropped."""

    foreign_items: Literal["reject", "drop"] = "reject"
    """What to do with vendor-prefixed input items of other implementations."""
    gate_unknown_tool: Literal["accept", "reject"] = "accept"
    """The replay gate and an output answering a call of a tool that neither the request
    nor its chain defines: accept it (logged; no schema to check the arguments against)
    or refuse it (400 ``unknown_tool``)."""
    max_image_bytes: int = Field(default=DEFAULT_MAX_IMAGE_BYTES, gt=0)
    """The largest image an ``input_image`` data URL may carry, decoded (400 ``image_too_large``)."""

    # Request limits: each exceeded one is a 400 that names the limit and the param.
    max_json_depth: int = Field(default=DEFAULT_MAX_JSON_DEPTH, ge=8)
    """How deep objects and arrays may nest in a request body or WebSocket frame
    (400 ``json_too_deep``)."""
    max_json_values: int = Field(default=DEFAULT_MAX_JSON_VALUES, gt=0)
    """Values (members of objects and elements of arrays, at any depth) a request body or
    WebSocket frame may hold (400 ``too_many_json_values``): each costs the event loop
    about 2 µs on its way in, so this bounds how long one request can hold the others."""
    max_input_items: int = Field(default=DEFAULT_MAX_INPUT_ITEMS, gt=0)
    """Items one request's ``input`` may hold (400 ``too_many_input_items``)."""
    max_tools: int = Field(default=DEFAULT_MAX_TOOLS, gt=0)
    """Entries one request's ``tools`` may hold (400 ``too_many_tools``)."""
    max_schema_bytes: int = Field(default=DEFAULT_MAX_SCHEMA_BYTES, gt=0)
    """Bytes of each JSON Schema (a tool's ``parameters``, ``text.format.schema``), as
    compact JSON (400 ``invalid_tool_schema`` / ``invalid_json_schema``)."""
    max_schema_depth: int = Field(default=DEFAULT_MAX_SCHEMA_DEPTH, gt=0)
    """How deep objects and arrays may nest in each JSON Schema."""
    history_cache_entries: int = Field(default=1024, ge=0)
    """Conversations whose chain is kept in memory after their latest turn was recorded, so
    the next turn does not reload and convert the whole chain (0: off)."""

    log_level: str = "info"
    """The log level (``debug``, ``info``, ``warning``, ``error``)."""
    metrics_key: SecretStr | None = None
    """A bearer key for ``GET /metrics`` alone; unset means the API keys (or none) protect it."""
    log_format: Literal["text", "json"] = "text"
    """``text`` lines, or ``json``: one JSON object per line. Either carries the request id."""

    def request_limits(self) -> RequestLimits:
        return RequestLimits(
            max_json_depth=self.max_json_depth,
            max_json_values=self.max_json_values,
            max_input_items=self.max_input_items,
            max_tools=self.max_tools,
            schema=SchemaLimits(max_bytes=self.max_schema_bytes, max_depth=self.max_schema_depth),
        )

    @field_validator("max_body_bytes_in_flight")
    @classmethod
    def _holds_one_body(cls, value: int, info: ValidationInfo) -> int:
        largest = info.data.get("max_body_bytes")
        if value and largest is not None and value < largest:
            raise ValueError(f"must be 0 (no bound) or at least ORS_MAX_BODY_BYTES ({largest}), "
                             "or a body of the largest size could never be received")
        return value

    @field_validator("model_aliases", mode="before")
    @classmethod
    def _split_pairs(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        pairs: dict[str, str] = {}
        for part in value.split(","):
            if not part.strip():
                continue
            alias, sep, target = part.partition("=")
            if not sep or not alias.strip() or not target.strip():
                raise ValueError(f"expected alias=model, got {part.strip()!r}")
            pairs[alias.strip()] = target.strip()
        return pairs

    @field_validator("api_keys", "preload_models", "upstream_models", "allowed_origins", "allowed_hosts",
                     mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
