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


def test_a_callers_traceparent_is_read_as_w3c_says() -> None:
    trace_id, span_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    context = tracing.extract(f"00-{trace_id}-{span_id}-01")
    assert context is not None and context.sampled
    assert context.traceparent == f"00-{trace_id}-{span_id}-01"
    unsampled = tracing.extract(f" 00-{trace_id.upper()}-{span_id}-00 ")
    assert unsampled is not None and not unsampled.sampled
    assert unsampled.trace_id == bytes.fromhex(trace_id)
    later = tracing.extract(f"01-{trace_id}-{span_id}-01-what-a-later-version-adds")
    assert later is not None and later.span_id == bytes.fromhex(span_id)
    for bad in (
        None,
        "",
        f"ff-{trace_id}-{span_id}-01",  # a forbidden version
        f"00-{'0' * 32}-{span_id}-01",  # all-zero ids
        f"00-{trace_id}-{'0' * 16}-01",
        f"00-{trace_id[:-1]}-{span_id}-01",
        f"00-{trace_id[:10]} {trace_id[11:]}-{span_id}-01",  # a space for a digit
        f"00-{trace_id}-{span_id}-0g",
        f"00-{trace_id}-{span_id}-01-more",  # version 00 has four fields
        f"01-{trace_id}-{span_id}-01more",
        "not a traceparent",
    ):
        assert tracing.extract(bad) is None, bad


def _context(trace_id: int, span_id: int, sampled: bool) -> tracing.SpanContext:
    return tracing.SpanContext(trace_id.to_bytes(16, "big"), span_id.to_bytes(8, "big"), sampled)


SAMPLED = _context(0xABC, 0x1, True)
UNSAMPLED = _context(0xABC, 0x2, False)
LOW = _context(1, 0x3, True)  # a trace id whose lower 64 bits any ratio > 0 takes


@pytest.mark.parametrize(
    ("sampler", "arg", "parent", "sampled"),
    [
        ("parentbased_always_on", "", None, True),
        ("parentbased_always_on", "", UNSAMPLED, False),  # the caller's decision holds
        ("parentbased_always_off", "", None, False),
        ("parentbased_always_off", "", SAMPLED, True),
        ("always_on", "", UNSAMPLED, True),  # not parent-based: decided here
        ("always_off", "", SAMPLED, False),
        ("traceidratio", "0", SAMPLED, False),
        ("traceidratio", "0.5", LOW, True),
        ("parentbased_traceidratio", "0", SAMPLED, True),
        ("no_such_sampler", "", UNSAMPLED, False),  # parentbased_always_on, with a warning
    ],
)
def test_a_span_is_sampled_as_otel_traces_sampler_says(
    monkeypatch: pytest.MonkeyPatch,
    sampler: str,
    arg: str,
    parent: tracing.SpanContext | None,
    sampled: bool,
) -> None:
    monkeypatch.setattr(tracing, "_sampler", tracing._Sampler(sampler, arg))
    span = tracing.Span(tracing.shape("s"), parent)
    assert span.sampled is sampled
    if parent is not None:
        assert (span.trace_id, span.parent_id) == (parent.trace_id, parent.span_id)
    assert tracing.traceparent() is None  # a span made, not entered, is not current
    token = tracing.activate(span)
    try:
        assert tracing.traceparent() == span.traceparent
    finally:
        tracing.deactivate(token)
