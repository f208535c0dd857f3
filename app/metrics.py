"""What the server counts, in the Prometheus format (prometheus-client).

One :class:`Metrics` per app, with its own registry (several apps may share a process, in
tests). Its values are prometheus-client's own ``Counter``, ``Histogram`` and ``Gauge``,
updated where things happen, at a few points only, never per token:

* the transport's middleware: every HTTP request by route template, method, status and
  model (``ors_http_requests_total``); WebSocket connections open
  (``ors_websocket_connections``);
* the engine, once per response when it ends: status, duration, time to first output,
  tokens in, out and served from the prompt cache, failures by error code (an upstream's
  failures are among them: ``upstream_unavailable``, ``upstream_error`` …), and the
  responses in progress (``ors_responses_in_progress``);
* the engine, when the replay gate or the schema admission refuses a request
  (``ors_gate_rejections_total`` by reason);
* at scrape time, a collector asks each backend for its gauges (the embedded engine's
  slots in use, slots, requests waiting, whether its server runs and how often it was
  started again after an exit), so nothing is kept up to date in between.

**Worker processes** (``ors serve --workers N``) count together: the parent sets
``PROMETHEUS_MULTIPROC_DIR`` before any worker starts, prometheus-client then keeps every
value in a file per process there, and a scrape, whichever worker answers it, sums all
of them (gauges of things open, like connections and responses in progress, as the sum
over the live workers).

The ``model`` of an HTTP request is noted by the engine into a holder that the
middleware creates per request (:func:`note_model`); requests that never reach the engine
have ``model=""``.

**Model labels are bounded.** A model id is the client's string: an upstream route
without a model list, or a prefix route, sends any id on, and each distinct one would
make a new series of every model-labelled metric (histograms included), for as long as
the process lives. The ids the server names itself (its routes' and backends' models,
aliases) are always label values; any other becomes one once a request or response for
it succeeded, and at most :data:`MODEL_LABELS` such ids do. Every other id is counted as
``model="other"``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from app.protocol.states import ResponseStatus

MODEL_LABELS = 100
"""Distinct model ids kept as label values (see the module docstring)."""
OTHER_MODEL = "other"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
"""Bounds of ``ors_time_to_first_token_seconds``: from 5 ms (a fast upstream) to five
minutes (a long prompt on a slow model), about 2 to 2.5 times apart."""
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
"""Bounds of ``ors_response_duration_seconds``: from a cached or refused answer (10 ms)
to a long generation (half an hour, a background response's scale)."""


@dataclass(slots=True)
class RequestLabels:
    """Filled in while a request is served; read by the middleware when it ends."""

    model: str = ""


current_request: ContextVar[RequestLabels | None] = ContextVar("current_request", default=None)


def note_model(model: str) -> None:
    """Record the model of the request being served (for ``ors_http_requests_total``)."""
    labels = current_request.get()
    if labels is not None:
        labels.model = model


class ModelGauges(Protocol):
    """A backend's view of one model at scrape time (``app.backends.base.ModelGauges``)."""

    model: str
    slots: int
    slots_busy: int
    waiting: int
    up: bool
    restarts: int
    memory_mib: int


class _Backends(Collector):
    def __init__(self, sources: Callable[[], Iterable[ModelGauges]]) -> None:
        self.sources = sources

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        slots = GaugeMetricFamily("ors_model_slots", "Generation slots of an embedded model.", labels=["model"])
        busy = GaugeMetricFamily("ors_model_slots_busy", "Slots generating now.", labels=["model"])
        waiting = GaugeMetricFamily("ors_model_queue_depth", "Requests waiting for a slot.", labels=["model"])
        up = GaugeMetricFamily("ors_model_up", "1 while an embedded model's server runs, 0 while it starts "
                               "again after an exit.", labels=["model"])
        restarts = CounterMetricFamily("ors_model_restarts", "Times an embedded model's server exited on its "
                                       "own and was started again.", labels=["model"])
        memory = GaugeMetricFamily("ors_model_memory_mib", "What a loaded embedded model is estimated to take "
                                   "(its weights and KV cache), counted against ORS_MODEL_MEMORY_MIB.",
                                   labels=["model"])
        for gauges in self.sources():
            memory.add_metric([gauges.model], gauges.memory_mib)
            slots.add_metric([gauges.model], gauges.slots)
            busy.add_metric([gauges.model], gauges.slots_busy)
            waiting.add_metric([gauges.model], gauges.waiting)
            up.add_metric([gauges.model], 1 if gauges.up else 0)
            restarts.add_metric([gauges.model], gauges.restarts)
        yield from (slots, busy, waiting, up, restarts, memory)


def _multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class Metrics:
    """The server's metrics, in a registry of their own (:attr:`registry`), updated as
    things happen through prometheus-client's types."""

    def __init__(self, backend_gauges: Callable[[], Iterable[ModelGauges]] = tuple,
                 named: Callable[[str], bool] = lambda model: False) -> None:
        """``backend_gauges``: each backend's gauges, asked at scrape time. ``named``:
        whether the server names a model id itself (see the module docstring)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self._backends = _Backends(backend_gauges)
        live = {"multiprocess_mode": "livesum"} if _multiprocess() else {}
        self.http_requests = Counter(
            "ors_http_requests", "HTTP requests, by route template, method, status and model.",
            ["route", "method", "status", "model"], registry=r)
        self.websocket_connections = Gauge(
            "ors_websocket_connections", "WebSocket connections open.", registry=r, **live)
        self.responses = Counter(
            "ors_responses", "Responses ended, by model and status.", ["model", "status"], registry=r)
        self.responses_in_progress = Gauge(
            "ors_responses_in_progress", "Responses being generated (streamed or not).", registry=r, **live)
        self.failures = Counter(
            "ors_response_failures", "Failed responses, by model and error code (upstream errors included).",
            ["model", "code"], registry=r)
        self.time_to_first_token = Histogram(
            "ors_time_to_first_token_seconds", "From the start of a response to its first output.",
            ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.duration = Histogram(
            "ors_response_duration_seconds", "From the start of a response to its end.",
            ["model"], buckets=DURATION_BUCKETS, registry=r)
        self.tokens = Counter(
            "ors_tokens", "Tokens, by model and kind: input, output, cached (input served from the prompt cache).",
            ["model", "kind"], registry=r)
        self.prompt_cache_hits = Counter(
            "ors_prompt_cache_hits", "Responses whose prompt was partly served from the prompt cache.",
            ["model"], registry=r)
        self.gate_rejections = Counter(
            "ors_gate_rejections", "Requests refused by the replay gate or schema admission, by reason.",
            ["reason"], registry=r)
        r.register(self._backends)
        self._named = named
        self._models: set[str] = {""}
        self._admitted = 0

    def _model(self, model: str, succeeded: bool) -> str:
        """``model`` as a label value: itself once admitted, :data:`OTHER_MODEL` else. An id
        the server names is admitted at once; another by a success, while fewer than
        :data:`MODEL_LABELS` such ids are."""
        if model in self._models:
            return model
        if not self._named(model):
            if not succeeded or self._admitted >= MODEL_LABELS:
                return OTHER_MODEL
            self._admitted += 1
        self._models.add(model)
        return model

    def exposition(self) -> bytes:
        """The text a scrape gets: this app's registry, or with worker processes (see the
        module docstring) every worker's values summed."""
        if not _multiprocess():
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged)
        merged.register(self._backends)
        return generate_latest(merged)

    def response_ended(
        self, *, model: str, status: str, error_code: str | None, seconds: float,
        first_output_seconds: float | None, input_tokens: int, output_tokens: int, cached_tokens: int,
    ) -> None:
        """A response ended (``status``: completed, incomplete, failed, cancelled), with
        its failure's code, its duration, the time to its first output (``None``: there
        was none) and its token counts."""
        model = self._model(model, status != ResponseStatus.FAILED)
        self.responses.labels(model, status).inc()
        self.duration.labels(model).observe(seconds)
        if first_output_seconds is not None:
            self.time_to_first_token.labels(model).observe(first_output_seconds)
        if error_code is not None:
            self.failures.labels(model, error_code).inc()
        self.tokens.labels(model, "input").inc(input_tokens)
        self.tokens.labels(model, "output").inc(output_tokens)
        if cached_tokens:
            self.tokens.labels(model, "cached").inc(cached_tokens)
            self.prompt_cache_hits.labels(model).inc()

    def http_request(self, route: str, method: str, status: int, model: str) -> None:
        """One HTTP request over (by route template, method, status and model)."""
        self.http_requests.labels(route, method, str(status), self._model(model, status < 400)).inc()

    def response_started(self) -> None:
        """A response began generating (``ors_responses_in_progress``)."""
        self.responses_in_progress.inc()

    def response_left(self) -> None:
        """A response that began generating is over, however it ended."""
        self.responses_in_progress.dec()
