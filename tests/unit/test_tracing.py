"""When traces are on: OpenTelemetry's own variables decide (protos/tracing.py)."""

from __future__ import annotations

import pytest

from protos import tracing


@pytest.mark.parametrize(
    ("environ", "exporter"),
    [
        ({}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, None),  # Compose passes an unset one on empty
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, None),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, None),  # not shipped: off, with a warning
    ],
)
def test_traces_are_off_unless_configured(environ: dict[str, str], exporter: str | None) -> None:
    assert tracing.configured(environ) == exporter


def test_off_no_span_is_made_and_no_context_is_sent() -> None:
    assert not tracing.ENABLED  # the test process never configures them
    assert tracing.ids() is None
    assert tracing.traceparent() is None
