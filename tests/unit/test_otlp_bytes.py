"""The spans' wire bytes (protos/otlp_bytes.py writes OTLP's protobuf itself): what
opentelemetry-proto's own parser reads from them."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from protos import otlp_bytes, tracing
from protos.tracing import Span, SpanContext, SpanKind

PARENT = SpanContext(bytes.fromhex("0123456789abcdef0123456789abcdef"), b"\x11" * 8, True)
LINK = SpanContext(bytes.fromhex("fedcba9876543210fedcba9876543210"), b"\x99" * 8, True)
SHAPE = tracing.shape(
    "inference.GRPCInferenceService/ModelInfer",
    SpanKind.CLIENT,
    (("rpc.system", "grpc"), ("server.port", 8102), ("neg", -3), ("ratio", 0.25), ("ok", True)),
)


def _read(span: Span) -> trace_pb2.Span:
    """`encode` writes ScopeSpans' `spans` field: read as a ScopeSpans of one span."""
    (message,) = trace_pb2.ScopeSpans.FromString(otlp_bytes.encode(span)).spans
    return message


def _ended(span: Span, error: str | None = None) -> Span:
    span.error = error
    span.end(span.start_ns + 100_000_000)
    return span


def test_a_span_reads_back_as_written() -> None:
    own = {"mesh.attempt": 2, "mesh.request_id": "r-1"}
    span = _ended(
        Span(SHAPE, PARENT, [LINK], 1_700_000_000_123_456_789, own),
        "CallFailed: endpoint digits-mlp:8102 unavailable (ü)",
    )
    message = _read(span)
    assert message.trace_id == PARENT.trace_id and message.parent_span_id == PARENT.span_id
    assert message.span_id == span.span_id and len(span.span_id) == 8 and any(span.span_id)
    assert message.name == SHAPE.name and message.kind == trace_pb2.Span.SPAN_KIND_CLIENT
    assert message.start_time_unix_nano == span.start_ns
    assert message.end_time_unix_nano == span.end_ns
    values = {kv.key: kv.value for kv in message.attributes}
    assert len(values) == len(message.attributes) == 7  # the shape's and its own, once each
    assert values["rpc.system"].string_value == "grpc"
    assert values["server.port"].int_value == 8102 and values["neg"].int_value == -3
    assert values["ratio"].double_value == 0.25 and values["ok"].bool_value is True
    assert values["mesh.attempt"].int_value == 2
    assert values["mesh.request_id"].string_value == "r-1"
    (link,) = message.links
    assert (link.trace_id, link.span_id) == (LINK.trace_id, LINK.span_id)
    assert message.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert message.status.message == span.error
    assert message.flags & 0x1FF == 0x101


def test_a_root_span_without_attributes_of_its_own_reads_back() -> None:
    span = _ended(Span(tracing.shape("queue"), None))
    message = _read(span)
    assert message.trace_id == span.trace_id and len(span.trace_id) == 16
    assert message.parent_span_id == b"" and not message.attributes and not message.links
    assert message.name == "queue" and message.kind == trace_pb2.Span.SPAN_KIND_INTERNAL
    assert message.status.code == trace_pb2.Status.STATUS_CODE_UNSET


def test_a_long_span_reads_back() -> None:
    """Past the lengths whose varints are written once (4096 bytes)."""
    span = _ended(Span(SHAPE, PARENT, attributes={"note": "x" * 5000}))
    assert len(otlp_bytes.encode(span)) > 5000
    values = {kv.key: kv.value for kv in _read(span).attributes}
    assert values["note"].string_value == "x" * 5000


def test_a_request_carries_the_resource_and_every_span() -> None:
    resource = otlp_bytes.resource_bytes("mesh-proxy", {"OTEL_RESOURCE_ATTRIBUTES": "a=b%20c"})
    spans = [_ended(Span(SHAPE, PARENT)), _ended(Span(SHAPE, None))]
    request = trace_service_pb2.ExportTraceServiceRequest.FromString(
        otlp_bytes.request_bytes(resource, spans)
    )
    (resource_spans,) = request.resource_spans
    attributes = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
    assert attributes["service.name"] == "mesh-proxy" and attributes["a"] == "b c"
    (scope,) = resource_spans.scope_spans
    assert scope.scope.name == "inference-mesh"
    assert [s.span_id for s in scope.spans] == [s.span_id for s in spans]
