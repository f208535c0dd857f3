"""The metrics' own bookkeeping, on a real prometheus-client registry: model labels stay
bounded whatever model ids clients send."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from app.metrics import MODEL_LABELS, OTHER_MODEL, Metrics


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
