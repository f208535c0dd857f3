"""The server's metrics on real prometheus-client registries: what a scrape reads after
requests and responses, one registry per app, and model labels bounded whatever model
ids clients send."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.metrics import DURATION_BUCKETS, LATENCY_BUCKETS, MODEL_LABELS, OTHER_MODEL, Metrics


def _models(metrics: Metrics, family: str) -> set[str]:
    text = metrics.exposition().decode()
    return {sample.labels["model"] for metric in text_string_to_metric_families(text) if metric.name == family
            for sample in metric.samples if "model" in sample.labels}


def _ended(metrics: Metrics, model: str, status: str) -> None:
    metrics.response_ended(model=model, status=status, error_code="upstream_error" if status == "failed" else None,
                           seconds=0.1, first_output_seconds=None, input_tokens=1, output_tokens=1, cached_tokens=0)


def test_a_model_is_a_label_once_it_succeeded() -> None:
    metrics = Metrics()
    for index in range(50):  # made-up ids an upstream refuses
        metrics.http_request("/v1/responses", "POST", 404, f"made-up-{index}")
        _ended(metrics, f"made-up-{index}", "failed")
    metrics.http_request("/v1/responses", "POST", 200, "real")
    _ended(metrics, "real", "completed")
    metrics.http_request("/v1/responses", "POST", 400, "real")  # a failure of an admitted model keeps its name
    metrics.http_request("/healthz", "GET", 200, "")
    assert _models(metrics, "ors_http_requests") == {OTHER_MODEL, "real", ""}
    assert _models(metrics, "ors_responses") == {OTHER_MODEL, "real"}
    assert _models(metrics, "ors_response_failures") == {OTHER_MODEL}


def test_at_most_so_many_models_are_labels() -> None:
    metrics = Metrics()
    for index in range(MODEL_LABELS + 50):  # an upstream that answers any id
        metrics.http_request("/v1/responses", "POST", 200, f"m{index}")
    models = _models(metrics, "ors_http_requests")
    assert len(models) == MODEL_LABELS + 1 and OTHER_MODEL in models and "m0" in models


def test_the_models_the_server_names_are_labels_from_the_start() -> None:
    metrics = Metrics(named={"local-model", "alias"}.__contains__)
    for index in range(MODEL_LABELS):  # made-up ids an upstream answers fill the admissions
        metrics.http_request("/v1/responses", "POST", 200, f"m{index}")
    _ended(metrics, "local-model", "failed")
    metrics.http_request("/v1/responses", "POST", 500, "alias")
    assert {"local-model", "alias"} <= _models(metrics, "ors_http_requests") | _models(metrics, "ors_responses")
    assert _models(metrics, "ors_response_failures") == {"local-model"}


Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(text: str, families: set[str] | None = None) -> Sample:
    """Every sample of an exposition but the creation times (of ``families`` only)."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if not sample.name.endswith("_created") and (families is None or family.name in families)}


def _same(reported: Sample, expected: Sample) -> None:
    """Equal samples; a histogram's sum to the last few bits."""
    assert reported.keys() == expected.keys()
    for key, value in expected.items():
        assert reported[key] == (pytest.approx(value, rel=1e-12) if key[0].endswith("_sum") else value), key


class Library:
    """The same metrics updated one by one through prometheus-client's own API: the
    oracle of what a scrape should read."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("ors_http_requests", "", ["route", "method", "status", "model"], registry=r)
        self.responses = Counter("ors_responses", "", ["model", "status"], registry=r)
        self.in_progress = Gauge("ors_responses_in_progress", "", registry=r)
        self.first = Histogram("ors_time_to_first_token_seconds", "", ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("ors_response_duration_seconds", "", ["model"], buckets=DURATION_BUCKETS, registry=r)
        self.tokens = Counter("ors_tokens", "", ["model", "kind"], registry=r)
        self.hits = Counter("ors_prompt_cache_hits", "", ["model"], registry=r)

    def families(self) -> set[str]:
        return {family.name for family in self.registry.collect()}


def test_a_scrape_reads_what_was_reported() -> None:
    """Random requests and responses reported to :class:`Metrics`, and the same updates
    made one by one on prometheus-client's metrics (the oracle): the same samples at
    every scrape, histogram buckets on their bounds included."""
    rng = random.Random(7)
    metrics, library = Metrics(), Library()
    durations = [0.0, 0.005, 0.01, 0.0100001, 0.3, 1, 29.9, 30, 301, 1799, 1800, 5000]
    for step in range(2000):
        model, status = rng.choice(["m1", "m2"]), rng.choice(["completed", "incomplete"])
        seconds = rng.choice(durations) if step % 3 else rng.uniform(0, 2000)
        first = None if step % 5 == 0 else rng.choice([*durations, rng.uniform(0, 400)])
        code = rng.choice([200, 400]) if step % 2 else 200
        metrics.response_started()
        metrics.http_request("/v1/responses", "POST", code, model)
        library.in_progress.inc()
        library.requests.labels("/v1/responses", "POST", str(code), model).inc()
        if step % 7:
            metrics.response_ended(model=model, status=status, error_code=None, seconds=seconds,
                                   first_output_seconds=first, input_tokens=step, output_tokens=step % 13,
                                   cached_tokens=step % 4)
            metrics.response_left()
            library.in_progress.dec()
            library.responses.labels(model, status).inc()
            library.duration.labels(model).observe(seconds)
            if first is not None:
                library.first.labels(model).observe(first)
            library.tokens.labels(model, "input").inc(step)
            library.tokens.labels(model, "output").inc(step % 13)
            if step % 4:
                library.tokens.labels(model, "cached").inc(step % 4)
                library.hits.labels(model).inc()
        if step % 400 == 0 or step == 1999:  # scrapes in between, and at the end
            expected = _samples(generate_latest(library.registry).decode())
            _same(_samples(metrics.exposition().decode(), library.families()), expected)
    assert expected[("ors_responses_in_progress", ())] == sum(1 for step in range(2000) if not step % 7)


def test_each_app_counts_in_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.http_request("/healthz", "GET", 200, "")
    first.response_started()
    first.gate_rejections.labels("arguments_parse").inc()
    one, other = _samples(first.exposition().decode()), _samples(second.exposition().decode())
    key = ("ors_http_requests_total", (("method", "GET"), ("model", ""), ("route", "/healthz"), ("status", "200")))
    assert one[key] == 1 and key not in other
    assert one[("ors_responses_in_progress", ())] == 1 and other[("ors_responses_in_progress", ())] == 0
    assert one[("ors_gate_rejections_total", (("reason", "arguments_parse"),))] == 1
    assert ("ors_gate_rejections_total", (("reason", "arguments_parse"),)) not in other


def test_the_backends_gauges_are_asked_at_each_scrape() -> None:
    from types import SimpleNamespace

    gauges = SimpleNamespace(model="local", slots=4, slots_busy=1, waiting=2, up=True, restarts=0, memory_mib=300)
    metrics = Metrics(lambda: [gauges])
    seen = _samples(metrics.exposition().decode())
    gauges.slots_busy, gauges.up, gauges.restarts = 3, False, 1
    later = _samples(metrics.exposition().decode())
    model = (("model", "local"),)
    assert (seen[("ors_model_slots", model)], seen[("ors_model_slots_busy", model)],
            seen[("ors_model_queue_depth", model)], seen[("ors_model_up", model)]) == (4, 1, 2, 1)
    assert seen[("ors_model_memory_mib", model)] == 300
    assert (later[("ors_model_slots_busy", model)], later[("ors_model_up", model)],
            later[("ors_model_restarts_total", model)]) == (3, 0, 1)
