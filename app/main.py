"""``create_app(settings)``: the one place where the parts are wired together."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from app.backends.base import Backend
from app.backends.http_client import Pool
from app.check_runs import CheckRuns
from app.config import Settings
from app.engine.engine import Engine
from app.engine.history import HistoryCache
from app.engine.live import LiveRuns
from app.engine.models import ModelRouter, Route
from app.engine.sealing import Sealer
from app.metrics import Metrics
from app.models_config import OperatorModels, operator_models
from app.store.factory import open_store, open_when_reachable
from app.store.retention import Retention
from app.transport.auth import KeyAuthenticator
from app.transport.drain import Drain
from app.transport.errors import install_error_handlers
from app.transport.guards import BodyBudget, Cors, Guards, exposure_problem, is_loopback
from app.transport.http import install_routes
from app.transport.metrics import install_metrics
from app.transport.ratelimit import rate_limiter
from app.transport.request_id import RequestIdMiddleware
from app.upstreams_config import UpstreamSpec

log = logging.getLogger("ors")


def workers_problem(settings: Settings) -> str | None:
    """Why ``settings.workers`` processes cannot serve together, or ``None``."""
    if settings.workers == 1:
        return None
    if not (settings.database_url or "").startswith("postgresql"):
        return (f"--workers {settings.workers} needs PostgreSQL (ORS_DATABASE_URL=postgresql+asyncpg://...): "
                "SQLite keeps one writing process. Use --workers 1 with SQLite.")
    if settings.upstream_url is None and settings.config is None:
        return (f"--workers {settings.workers} serves upstream models only (the embedded engine batches its "
                "requests in one process, and each worker would load its own copy of a model): configure an "
                "upstream (ORS_UPSTREAM_URL or ORS_CONFIG), or use --workers 1.")
    return None


def worker_app() -> FastAPI:
    """The app of one worker process of ``ors serve --workers N`` (a uvicorn factory):
    its settings from the ``ORS_*`` variables the parent set, upstream models only (see
    :func:`workers_problem`). Each worker has its own store connections, history cache
    and upstream clients; they share PostgreSQL, which carries cancels between them."""
    from app import logs
    from app.serve import drain_on_exit_signals

    settings = Settings()
    logs.configure(settings.log_level, settings.log_format)
    app = create_app(settings, backends=[])

    def on_serving() -> None:
        drain_on_exit_signals(app.state.drain)
        settle_heap()

    app.state.on_serving = on_serving
    return app


def default_backends(settings: Settings, operators: OperatorModels | None = None) -> list[Backend]:
    """The embedded models, built-in and the ``operators``' (upstreams are routes:
    :func:`upstream_routes`)."""
    from app.backends.local import LocalBackend

    extra = operators.specs if operators is not None else {}
    return [
        LocalBackend(
            cache_dir=settings.data_dir,
            n_threads=settings.model_threads,
            n_ctx=settings.model_context,
            preload=_preload(settings, extra),
            parallel=settings.model_parallel,
            queue=settings.model_queue,
            cache_ram_mib=settings.model_cache_ram_mib,
            kv_type=settings.model_kv_type,
            chunk=settings.model_chunk,
            temperature=settings.model_temperature,
            server_binary=settings.llama_server,
            hang_seconds=settings.model_hang_seconds,
            extra_models=extra,
            memory_mib=settings.model_memory_mib,
            idle_seconds=settings.model_idle_seconds,
        )
    ]


def upstream_routes(settings: Settings) -> list[Route]:
    """One route per upstream: those of ``ORS_CONFIG``, then the ``ORS_UPSTREAM_*``
    shortcut. Each upstream is one backend (one kept-alive HTTP client) of its wire API.
    Raises ``ValueError`` (``UpstreamsConfigError``) naming what is wrong."""
    from app.upstreams_config import load_upstreams, shortcut_upstream

    specs = load_upstreams(settings.config) if settings.config is not None else []
    if settings.upstream_url:
        key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
        specs.append(shortcut_upstream(settings.upstream_url, key, settings.upstream_models))
    pool = Pool(max_connections=settings.upstream_max_connections, max_keepalive=settings.upstream_max_keepalive,
                wait=settings.upstream_pool_timeout)
    return [
        Route(
            name=spec.name,
            backend=upstream_backend(spec, pool),
            models=spec.models,
            prefixes=spec.prefixes,
            strip_prefix=spec.strip_prefix,
            list_models=spec.list_models,
        )
        for spec in specs
    ]


def upstream_backend(spec: UpstreamSpec, pool: Pool = Pool()) -> Backend:
    """The adapter of an upstream's wire API, with its dialect options, its TLS files and
    the bounds of its connection pool."""
    options = dataclasses.asdict(spec.dialect)
    if spec.wire_api == "responses":
        from app.backends.responses_upstream import ResponsesUpstreamBackend

        return ResponsesUpstreamBackend(spec.base_url, api_key=spec.api_key, owned_by=spec.name, pool=pool,
                                        tls=spec.tls, input_modalities=spec.input_modalities,
                                        model_input_modalities=spec.model_input_modalities, **options)
    from app.backends.chat_completions import ChatCompletionsBackend

    return ChatCompletionsBackend(spec.base_url, api_key=spec.api_key, owned_by=spec.name, pool=pool, tls=spec.tls,
                                  input_modalities=spec.input_modalities,
                                  model_input_modalities=spec.model_input_modalities, **options)


def _preload(settings: Settings, extra: Mapping[str, object]) -> list[str]:
    from app.backends.model_files import LOCAL_MODELS

    wanted = [settings.default_model, *settings.preload_models]
    return [model for model in dict.fromkeys(wanted) if model in LOCAL_MODELS or model in extra]


def create_app(settings: Settings, *, backends: Sequence[Backend] | None = None) -> FastAPI:
    """Build the application. ``backends`` replaces the embedded models (tests use it to
    add the scripted backend); the upstreams of the settings are routed beside them. All
    are started and closed with the app, and so is the response store. A configuration
    that cannot be used (the upstreams file, a key entry) raises ``ValueError``."""
    operators = OperatorModels()
    if backends is None and (settings.models_dir is not None or settings.config is not None):
        operators = operator_models(settings.models_dir, settings.config)
    own = list(backends) if backends is not None else default_backends(settings, operators)
    routes = upstream_routes(settings)
    chosen = [*own, *(route.backend for route in routes)]
    authenticator = KeyAuthenticator([key.get_secret_value() for key in settings.api_keys])
    router = ModelRouter(own, settings.default_model, {**operators.aliases, **settings.model_aliases}, routes)
    metrics = Metrics(lambda: [g for backend in chosen for g in backend.gauges()], named=router.names)
    # made here, opened (connected, migrated) by the lifespan
    store = open_store(settings.database_url, settings.data_dir, instance_id=uuid.uuid4().hex,
                       positional_tenants=authenticator.positional_tenants())
    sealer = Sealer.from_settings(settings.secret_key, settings.data_dir)
    live = LiveRuns()
    engine = Engine(
        router,
        store=store,
        sealer=sealer,
        history_cache=HistoryCache(settings.history_cache_entries),
        metrics=metrics,
        live=live,
        foreign_items=settings.foreign_items,
        gate_unknown_tool=settings.gate_unknown_tool,
        max_image_bytes=settings.max_image_bytes,
        file_limits=settings.file_limits(),
        limits=settings.request_limits(),
        tool_search=settings.tool_search_limits(),
        mcp=settings.mcp_limits(),
    )
    drain = Drain()
    check_runs = CheckRuns()
    limiter = rate_limiter(rpm=settings.rate_limit_rpm, concurrent=settings.rate_limit_concurrent,
                           redis_url=settings.redis_url, redis_prefix=settings.redis_prefix)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        check_exposure(settings)
        drain.bind()
        drain.when_draining(check_runs.abandon)
        await open_when_reachable(store, settings.database_wait_seconds)
        await limiter.start()
        # a cancel recorded by any replica stops the run if it runs here
        await store.watch_cancels(live.cancel)
        # and a replica asked to follow a response that runs here is sent its events
        await store.serve_follows(live.relayed)
        for backend in chosen:
            await backend.start()
        drain_task = asyncio.create_task(_drain_when_asked(drain, live))
        retention = (Retention(store, settings.response_retention_days)
                     if settings.response_retention_days is not None else None)
        if retention is not None:
            retention.start()
        app.state.ready = True
        if (on_serving := getattr(app.state, "on_serving", None)) is not None:
            on_serving()
        try:
            yield
        finally:
            app.state.ready = False
            drain_task.cancel()
            await live.drain()
            await limiter.aclose()
            for backend in reversed(chosen):
                await backend.aclose()
            if retention is not None:
                await retention.close()
            await store.close()

    app = FastAPI(
        title="Open Responses Server",
        version="0.1.0",
        lifespan=lifespan,
        **framework_telemetry(),
    )
    app.state.settings = settings
    app.state.ready = False
    app.state.drain = drain
    app.state.check_runs = check_runs
    app.state.live = live
    app.state.engine = engine
    app.state.sealer = sealer
    app.state.backends = chosen
    app.state.authenticator = authenticator
    app.state.limiter = limiter
    install_error_handlers(app)
    install_routes(app)
    install_metrics(app, metrics, metrics_key=settings.metrics_key.get_secret_value() if settings.metrics_key else None)
    install_guards(app, settings)
    app.add_middleware(RequestIdMiddleware)
    return app


GC_THRESHOLDS = (20_000, 50, 100)
"""The collector's thresholds once serving (Python's are 700, 10, 10)."""


def framework_telemetry() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry (FastAPI 0.16x and later) for the kinds (traces,
    metrics, logs) whose global provider is configured when the app is made, as
    ``opentelemetry-instrument`` does before the server starts; the other kinds off.
    Left on, FastAPI would ask on every request and WebSocket whether each provider has
    been configured since. An older FastAPI has no such option and gets nothing."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    from opentelemetry import _logs, metrics, trace

    return {"telemetry": {
        "tracing": _configured(trace.get_tracer_provider()),
        "metrics": _configured(metrics.get_meter_provider()),
        "logs": _configured(_logs.get_logger_provider()),
    }}


def _configured(provider: object) -> bool:
    """Not the API's stand-in that waits for a provider to be set (``ProxyTracerProvider``,
    ``_ProxyMeterProvider``, ``ProxyLoggerProvider``)."""
    return not type(provider).__name__.lstrip("_").startswith("Proxy")


def settle_heap() -> None:
    """Once ``ors serve`` serves (the process is the server's own; tests that build many
    apps in one process do not call it): what start-up made (modules, schemas, models) lives as
    long as the process, so it is moved out of the collector's sight (``gc.freeze``), and
    collections are made rarer (:data:`GC_THRESHOLDS`), since each one pauses the event
    loop for every request in flight. Garbage without cycles is freed at once whatever
    the thresholds; only cyclic garbage waits a little longer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def install_guards(app: FastAPI, settings: Settings) -> None:
    """The exposure guards around the app, and CORS outside them (so that a refusal
    still carries its CORS headers and a browser can read it); CORS only when origins
    are configured."""
    app.state.bodies = BodyBudget(settings.max_body_bytes_in_flight)  # HTTP bodies and WebSocket frames
    app.add_middleware(
        Guards,
        bind_host=settings.host,
        allowed_hosts=settings.allowed_hosts,
        allowed_origins=settings.allowed_origins,
        max_body_bytes=settings.max_body_bytes,
        bodies=app.state.bodies,
        read_timeout=settings.request_read_timeout,
    )
    if settings.allowed_origins:
        app.add_middleware(
            Cors,
            allow_origins=[origin.strip().rstrip("/") for origin in settings.allowed_origins],
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["*"],
            expose_headers=["Retry-After"],
        )


async def _drain_when_asked(drain: Drain, live: LiveRuns) -> None:
    await drain.wait()
    await live.drain()


class ExposureRefused(RuntimeError):
    """The server must not start with these settings (see :func:`exposure_problem`)."""


def check_exposure(settings: Settings) -> None:
    """Refuse a non-loopback bind without keys unless explicitly allowed; say what the
    exposure is."""
    problem = exposure_problem(
        settings.host, has_keys=bool(settings.api_keys), allow_unauthenticated=settings.allow_unauthenticated
    )
    if problem is not None:
        raise ExposureRefused(problem)
    if settings.api_keys:
        tenants = KeyAuthenticator([key.get_secret_value() for key in settings.api_keys]).tenants
        log.info("API keys configured: %d key(s), %d tenant(s): %s", len(settings.api_keys), len(tenants),
                 ", ".join(tenants))
        return
    log.info("no API keys configured: serving one anonymous tenant")
    if not is_loopback(settings.host):
        log.warning("listening on %s without API keys (ORS_ALLOW_UNAUTHENTICATED): anyone who can reach it "
                    "can use it", settings.host)
