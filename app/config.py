"""Settings, from ``ORS_*`` environment variables and command-line flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.backends.http_client import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_KEEPALIVE, DEFAULT_POOL_WAIT
from app.engine.files import DEFAULT_MAX_PAGES, DEFAULT_MAX_TEXT_CHARS, FileLimits
from app.engine.images import DEFAULT_MAX_IMAGE_BYTES
from app.engine.limits import (
    DEFAULT_MAX_INPUT_ITEMS,
    DEFAULT_MAX_JSON_DEPTH,
    DEFAULT_MAX_JSON_VALUES,
    DEFAULT_MAX_TOOLS,
    RequestLimits,
)
from app.engine.mcp import DEFAULT_CALL_SECONDS, DEFAULT_MAX_CALLS, DEFAULT_MAX_OUTPUT_BYTES, McpLimits
from app.engine.tool_search import DEFAULT_RESULTS, DEFAULT_ROUNDS, ToolSearchLimits
from app.schemas import DEFAULT_MAX_SCHEMA_BYTES, DEFAULT_MAX_SCHEMA_DEPTH, SchemaLimits
from app.url_roots import AllowList

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
    """Worker processes sharing the port. More than 1 needs PostgreSQL (``ORS_DATABASE_URL``;
    SQLite keeps one writing process) and an upstream, and serves upstream models only:
    the embedded engine batches its requests in one process."""

    default_model: str = DEFAULT_MODEL
    """The model used when a request names none; loaded at start."""
    preload_models: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated embedded models also loaded at start (others load on first use;
    the default model is always loaded when it is embedded)."""
    model_threads: int = 2
    """CPU threads of each embedded model."""
    model_context: int | None = None
    """Tokens of context of each embedded model (shared by its slots; the most one request
    may use); unset means each model's trained window (Qwen2.5-Coder 32,768, SmolLM2 8,192)."""
    model_parallel: int = Field(default=4, ge=1, le=64)
    """Generations an embedded model runs at once, decoded together in one batch per step
    (continuous batching)."""
    model_queue: int = Field(default=32, ge=0)
    """Requests that may wait for a busy embedded model; one more is 429 ``too_many_requests``."""
    model_cache_ram_mib: int = Field(default=2048, ge=0)
    """Host memory (MiB) for the prompt caches of idle slots, least recently used out
    (``0`` turns it off)."""
    model_kv_type: Literal["f16", "q8_0", "q4_0"] = "f16"
    """The KV cache's type: ``f16``, ``q8_0`` (half the memory, at a small cost in quality)
    or ``q4_0``."""
    model_chunk: int = Field(default=128, ge=16, le=8192)
    """Prompt tokens an embedded model evaluates per step, between two decoding steps of
    the streams already running: the longest a running stream waits for a new prompt."""
    model_temperature: float | None = Field(default=None, ge=0, le=2)
    """Sampling temperature of the embedded models for a request that sets none; unset
    means each model's own (Qwen 0.7, SmolLM2 0.2). ``0`` decodes greedily, the same
    answer to the same prompt: for agents whose client sends none (Codex)."""
    model_hang_seconds: float = Field(default=120.0, ge=0)
    """Seconds a running embedded model's llama-server may answer nothing (a stuck loop, a
    stopped process) before it is killed and started again; its streams then end with
    ``response.failed``. ``0``: never."""
    model_memory_mib: int | None = Field(default=None, ge=1)
    """Memory (MiB) the loaded embedded models may take together, each estimated from its
    file's size and the KV cache of its window at its KV type (``/metrics``:
    ``ors_model_memory_mib``). Loading one more first unloads the least recently used idle
    models; if those in use hold too much, the request is 503 ``model_unavailable`` with
    ``Retry-After``. Unset: no bound."""
    model_idle_seconds: float = Field(default=0, ge=0)
    """Seconds an embedded model may go unused before it is unloaded (its prompt cache
    saved; the next request loads it again and waits for that). ``0``: never."""
    models_dir: Path | None = None
    """A folder of GGUF files served by the embedded engine beside the built-in models:
    each ``*.gguf`` under its file's stem, each subfolder (a model with its shards and
    ``mmproj*`` projector) under the folder's name, as llama.cpp's router reads
    ``--models-dir``. ``[models.ID]`` entries of ``ORS_CONFIG`` add files with their
    settings (see Models in the README). Unset: the built-in models only."""
    llama_server: str | None = None
    """Path of the llama-server executable that runs the embedded models; unset means the
    one ``make install`` built into ``.venv/bin``."""
    model_aliases: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    """Other names for served models, ``alias=model,...`` (e.g. ``gpt-4o-mini=qwen2.5-coder-1.5b-instruct``,
    so clients with a hard-wired model name work): requests for an alias run on its model
    and echo the alias; ``/v1/models`` lists the aliases."""

    upstream_url: str | None = None
    """An OpenAI-compatible Chat Completions base URL, e.g. ``http://127.0.0.1:11434/v1``.
    Requests for models that are not local go there."""
    upstream_api_key: SecretStr | None = None
    """The bearer key sent to the upstream."""
    upstream_models: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated allow-list of upstream model ids: if set, only these are routed
    upstream (others are ``model_not_found``)."""
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
    Upstreams in the README); the ``ORS_UPSTREAM_*`` settings stay the one-upstream
    shortcut beside it."""

    data_dir: Path = Path("data")
    """Assembled model files and server data: stored responses, prompt caches, logs, keys.
    ``ors serve`` writes everything with mode 0600 (directories 0700), and warns at start
    if this directory itself can be read by other users."""
    database_url: str | None = None
    """The response store, a SQLAlchemy URL. Unset means SQLite at ``ORS_DATA_DIR/ors.db``
    (written by one thread of the server, which commits concurrent writes together);
    ``postgresql+asyncpg://…`` for several replicas sharing one database (each server
    process opens up to 20 connections for reads, writes and its liveness lock, 4 for
    the starts of responses, and 2 of its own that listen for cancels and for the events
    of responses followed from another replica). While the
    database cannot be reached, what needs it is 503 ``store_unavailable`` with
    ``Retry-After: 1``; ``store: false`` is still served."""
    database_wait_seconds: float = Field(default=30.0, ge=0)
    """At start, how long to keep trying a database that cannot be reached (it may start
    after the server, as in a compose file or a pod), once a second, with one warning;
    then the server exits with the error (exit code 3, with ``--workers`` too). ``0``: do
    not wait."""

    response_retention_days: float | None = Field(default=None, gt=0)
    """Stored responses are deleted, as ``DELETE`` deletes them, this many days after they
    were created (finished ones only; fractions allowed), checked at start and then every
    tenth of it (at most hourly); a conversation's older turns stay in the context of its
    visible later turns, but can no longer be fetched. Unset: kept until deleted."""

    api_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    """Comma-separated bearer keys, ``name:secret`` (the tenant is ``name``; several secrets
    may share it, which is how a key is rotated) or a bare secret (the tenant is a keyed
    digest of it). Each tenant's stored responses are seen by no other tenant (see Keys and
    tenants in the README); unset means one anonymous tenant."""
    secret_key: SecretStr | None = None
    """Keys for encrypted content, comma-separated, newest first (older ones still
    decrypt); unset means a key generated once in ``ORS_DATA_DIR/secret.key``."""

    rate_limit_rpm: int | None = Field(default=None, ge=1)
    """Requests per minute per tenant (any 60 seconds) on ``POST /v1/responses``,
    ``POST /v1/responses/compact`` and WebSocket ``response.create``; one more is 429
    ``rate_limit_exceeded`` with ``Retry-After``. Unset: unlimited."""
    rate_limit_concurrent: int | None = Field(default=None, ge=1)
    """Responses in flight per tenant (streams, JSON requests, background responses,
    WebSocket turns); one more is 429 ``rate_limit_exceeded`` with ``Retry-After: 1``.
    Unset: unlimited."""
    redis_url: str | None = None
    """Redis that counts the rate limits, so several replicas share each tenant's budget
    (``redis://host:6379/0``). Unset: counted in this process's memory. If Redis cannot be
    reached, requests are let through (fail open) with a warning in the log."""
    redis_prefix: str = "ors"
    """Prefix of the rate limits' Redis keys, so several deployments can share one Redis."""
    ws_max_connection_seconds: float = 3600.0
    """The lifetime of a WebSocket connection."""

    allow_unauthenticated: bool = False
    """Serve without ``ORS_API_KEYS`` on an address that is not loopback; without it
    ``ors serve`` refuses to start there (exit code 2)."""
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated browser origins (``https://app.example``, or ``*``) that may open
    WebSocket connections and make CORS requests; unset means no CORS, and a WebSocket
    upgrade carrying an ``Origin`` is refused (403 ``origin_not_allowed``). Clients that
    send no ``Origin`` (SDKs, CLIs) are always served."""
    ui: bool = True
    """The playground page at ``/`` (its files under ``/ui/``): talk to a model, watch the
    response's items and events, browse stored responses, run the conformance checks.
    ``false``: both answer 404."""
    check_allowed_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated API roots (``http://10.0.0.5:8080/v1``; a root is allowed with any
    path below it) that the playground's conformance runs (``POST /ors/checks``) may check
    besides this server itself; unset: this server only. ors sends requests to them, so
    list only servers you trust."""
    mcp_allowed_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated MCP servers that ``mcp`` tools may name: URL prefixes
    (``https://mcp.example.com/tools``: that URL and any path below it, same scheme, host
    and port) or bare hosts (``mcp.example.com``, ``10.0.0.5:8000``). ors connects to them
    and sends them what the model writes, so list only servers you trust; loopback and
    private addresses are reached only when listed, redirects never followed. Unset (the
    default): MCP is off, and a request with an ``mcp`` tool is a 400."""
    mcp_max_calls: int = Field(default=DEFAULT_MAX_CALLS, ge=1, le=1_000)
    """MCP tool calls ors makes within one response; a further call the model asks for is
    not run (logged) and the response ends there."""
    mcp_call_seconds: float = Field(default=DEFAULT_CALL_SECONDS, gt=0)
    """Seconds one MCP call, or one listing of a server's tools, may take; past them it
    fails (an ``mcp_call`` or ``mcp_list_tools`` with its ``error``)."""
    mcp_max_output_bytes: int = Field(default=DEFAULT_MAX_OUTPUT_BYTES, ge=256)
    """Bytes of one MCP call's output given to the model and reported; a longer output is
    cut, with a note saying so."""
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Comma-separated host names accepted besides ``localhost``, ``127.0.0.1`` and
    ``[::1]`` when the server listens on a loopback address; any other ``Host`` is 403
    ``host_not_allowed`` (a guard against DNS rebinding)."""
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    """The largest request body and WebSocket message (32 MiB: room for a 20 MiB image as a
    data URL); a larger body is 413 ``request_too_large``, a larger message closes the
    WebSocket with 1009."""
    max_body_bytes_in_flight: int = Field(default=8 * DEFAULT_MAX_BODY_BYTES, ge=0)
    """The bytes of all request bodies a server process holds at once (256 MiB, eight of
    the largest; each worker of ``--workers`` has its own), each from its headers until its
    response is over; a body that would pass it is 429 ``server_busy`` with
    ``Retry-After: 1``. At least ``ORS_MAX_BODY_BYTES``; ``0`` for no bound."""
    request_read_timeout: float = Field(default=30.0, ge=0)
    """Seconds a client may go silent while sending a request's body; past it the request
    is answered 408 ``request_timeout`` and the connection closed. 0: no limit. A client
    slow to send its headers is the reverse proxy's to bound (README, "Behind a reverse
    proxy")."""
    sse_ping_seconds: float = Field(default=15.0, ge=0)
    """Seconds of silence in a stream (SSE) after which a keep-alive comment (``: ping``) is
    sent, so that proxies and clients do not time out an idle stream. 0: no pings."""
    sse_send_timeout: float = Field(default=30.0, ge=0)
    """Seconds one write of a stream (SSE) may wait for a client that reads nothing; past
    it the stream ends as if the client had left (``incomplete``). 0: no limit."""
    ws_max_queued_frames: int = Field(default=4, ge=0)
    """``response.create`` frames that may wait behind a WebSocket connection's running
    turn; one more is dropped and answered at once with an error envelope (429
    ``too_many_queued_frames``, ``param: "type"``), and the connection stays open. With
    ``stream_id``, this many may wait on each stream."""
    ws_max_streams: int = Field(default=8, ge=1)
    """Streams (``stream_id``; frames without one are a stream too) of one WebSocket
    connection that may hold work at once: a response running or frames waiting. A
    ``response.create`` that would open one more is answered at once with an error
    envelope (429 ``too_many_streams``, ``param: "stream_id"``). The connection keeps the
    latest response of this many most recently used streams in memory, for ``store:
    false`` continuations."""

    foreign_items: Literal["reject", "drop"] = "reject"
    """What to do with other implementations' vendor-prefixed input items: ``reject``
    (400 ``namespaced``) or ``drop`` (logged)."""
    gate_unknown_tool: Literal["accept", "reject"] = "accept"
    """The replay gate and an output answering a call of a tool that neither the request
    nor its chain defines: accept it (logged; no schema to check the arguments against)
    or refuse it (400 ``unknown_tool``)."""
    max_image_bytes: int = Field(default=DEFAULT_MAX_IMAGE_BYTES, gt=0)
    """The largest image an ``input_image`` data URL may carry, decoded (400 ``image_too_large``)."""
    file_max_pages: int = Field(default=DEFAULT_MAX_PAGES, gt=0)
    """Pages of a PDF (an ``input_file``) read as text for the model; a PDF with more is a
    400 ``file_too_many_pages`` naming the part's ``file_data``."""
    file_max_text_chars: int = Field(default=DEFAULT_MAX_TEXT_CHARS, gt=0)
    """Characters of text read from one ``input_file`` (a text file, or a PDF's text layer
    without its page markers); a longer one is a 400 ``file_text_too_long`` naming the
    part's ``file_data``."""
    tool_search_results: int = Field(default=DEFAULT_RESULTS, ge=1, le=100)
    """Deferred tools one tool search run by this server loads at most (the model may ask
    for fewer with the search's ``limit``)."""
    tool_search_rounds: int = Field(default=DEFAULT_ROUNDS, ge=1, le=100)
    """Tool searches run by this server within one response; a further search the model
    asks for is not run (logged) and the response ends there."""

    # Request limits: each exceeded one is a 400 that names the limit and the param.
    max_json_depth: int = Field(default=DEFAULT_MAX_JSON_DEPTH, ge=8)
    """How deep objects and arrays may nest in a request body or WebSocket frame
    (400 ``json_too_deep``, ``param`` the top-level field)."""
    max_json_values: int = Field(default=DEFAULT_MAX_JSON_VALUES, gt=0)
    """Values (members of objects and elements of arrays, at any depth) a request body or
    WebSocket frame may hold (400 ``too_many_json_values``, ``param`` the top-level field
    that holds the most): each costs the event loop time on its way in, so this bounds
    how long one request can hold the others."""
    max_input_items: int = Field(default=DEFAULT_MAX_INPUT_ITEMS, gt=0)
    """Items one request's ``input`` may hold (400 ``too_many_input_items``)."""
    max_tools: int = Field(default=DEFAULT_MAX_TOOLS, gt=0)
    """Entries one request's ``tools`` may hold (400 ``too_many_tools``)."""
    max_schema_bytes: int = Field(default=DEFAULT_MAX_SCHEMA_BYTES, gt=0)
    """Bytes of each JSON Schema (a tool's ``parameters``, ``text.format.schema``), as
    compact JSON (400 ``invalid_tool_schema`` / ``invalid_json_schema``)."""
    max_schema_depth: int = Field(default=DEFAULT_MAX_SCHEMA_DEPTH, gt=0)
    """How deep objects and arrays may nest in each JSON Schema (400
    ``invalid_tool_schema`` / ``invalid_json_schema``)."""
    history_cache_entries: int = Field(default=1024, ge=0)
    """Conversations whose chain stays in memory after their latest turn was recorded, so
    the next ``previous_response_id`` turn does not reload and convert the whole chain
    (``0``: off; the store is still asked whether the response exists)."""

    codex_bin: str = "codex"
    """The Codex CLI that ``ors codex`` runs: a path, or a name looked up on ``PATH``. Codex
    is installed with ``npm install -g @openai/codex``."""

    log_level: str = "info"
    """The log level (``debug``, ``info``, ``warning``, ``error``)."""
    metrics_key: SecretStr | None = None
    """A bearer key that alone reads ``GET /metrics``; unset means ``/metrics`` is protected
    like the API (any key of ``ORS_API_KEYS``, or open without keys)."""
    log_format: Literal["text", "json"] = "text"
    """``text`` lines or ``json`` (one object per line: ``time``, ``level``, ``logger``,
    ``message``, ``request_id``). Every request's id (the client's ``x-request-id``, or a
    new one) is returned as ``x-request-id`` and carried by its log lines; user text and
    keys are never logged."""

    def mcp_limits(self) -> McpLimits:
        return McpLimits(allowed=AllowList.parse(self.mcp_allowed_urls), max_calls=self.mcp_max_calls,
                         call_seconds=self.mcp_call_seconds, max_output_bytes=self.mcp_max_output_bytes)

    @field_validator("mcp_allowed_urls")
    @classmethod
    def _mcp_urls_parse(cls, value: list[str]) -> list[str]:
        AllowList.parse(value)  # a ValueError naming the entry
        return value

    def tool_search_limits(self) -> ToolSearchLimits:
        return ToolSearchLimits(results=self.tool_search_results, rounds=self.tool_search_rounds)

    def file_limits(self) -> FileLimits:
        return FileLimits(max_pages=self.file_max_pages, max_text_chars=self.file_max_text_chars)

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
                     "check_allowed_urls", "mcp_allowed_urls", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
