"""The app's wiring: FastAPI's own OpenTelemetry is on only for the kinds configured."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry", reason="FastAPI before 0.16x brings no OpenTelemetry (and has no such option)")

from opentelemetry import _logs, metrics, trace  # noqa: E402
from opentelemetry.metrics import NoOpMeterProvider  # noqa: E402
from opentelemetry.metrics._internal import _ProxyMeterProvider  # noqa: E402

from app.main import _configured, framework_telemetry  # noqa: E402


def test_nothing_configured_turns_every_kind_off() -> None:
    assert not _configured(trace.get_tracer_provider())
    assert framework_telemetry() in ({}, {"telemetry": {"tracing": False, "metrics": False, "logs": False}})


def test_a_set_provider_counts_as_configured_and_the_stand_ins_do_not() -> None:
    assert _configured(trace.NoOpTracerProvider())
    assert _configured(NoOpMeterProvider())
    assert _configured(_logs.NoOpLoggerProvider())
    assert not _configured(trace.ProxyTracerProvider())
    assert not _configured(_ProxyMeterProvider())
    assert not _configured(_logs.get_logger_provider())
    assert not _configured(metrics.get_meter_provider())
