"""The spans' wire bytes (protos/trace_export.py writes OTLP's protobuf itself): what
opentelemetry-proto's own parser reads from them."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from protos import trace_export
from protos.tracing import Span, SpanContext, SpanKind


def _span(error: str | None = None) -> Span:
    parent = SpanContext(0x0123456789ABCDEF0123456789ABCDEF, 0x1122334455667788, True)
    link = SpanContext(0xFEDCBA9876543210FEDCBA9876543210, 0x99AABBCCDDEEFF00, True)
    span = Span(
        "inference.GRPCInferenceService/ModelInfer",
        SpanKind.CLIENT,
        {"rpc.system": "grpc", "server.port": 8102, "neg": -3, "ratio": 0.25, "ok": True},
        parent,
        [link],
        1_700_000_000_123_456_789,
    )
    span.error = error
    span.end(1_700_000_000_223_456_789)
    return span


def test_a_span_reads_back_as_written() -> None:
    span = _span("CallFailed: endpoint digits-mlp:8102 unavailable (ü)")
    message = trace_pb2.Span.FromString(trace_export.encode(span))
    assert message.trace_id == span.context.trace_id.to_bytes(16, "big")
    assert message.span_id == span.context.span_id.to_bytes(8, "big")
    assert message.parent_span_id == (0x1122334455667788).to_bytes(8, "big")
    assert message.name == span.name and message.kind == trace_pb2.Span.SPAN_KIND_CLIENT
    assert message.start_time_unix_nano == span.start_ns
    assert message.end_time_unix_nano == span.end_ns
    values = {kv.key: kv.value for kv in message.attributes}
    assert values["rpc.system"].string_value == "grpc"
    assert values["server.port"].int_value == 8102 and values["neg"].int_value == -3
    assert values["ratio"].double_value == 0.25 and values["ok"].bool_value is True
    (link,) = message.links
    assert link.span_id == (0x99AABBCCDDEEFF00).to_bytes(8, "big")
    assert message.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert message.status.message == span.error
    assert message.flags & 0x1FF == 0x101


def test_a_request_carries_the_resource_and_every_span() -> None:
    resource = trace_export._resource("mesh-proxy", {"OTEL_RESOURCE_ATTRIBUTES": "a=b%20c"})
    spans = [_span(), _span()]
    request = trace_service_pb2.ExportTraceServiceRequest.FromString(
        trace_export.request_bytes(resource, spans)
    )
    (resource_spans,) = request.resource_spans
    attributes = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
    assert attributes["service.name"] == "mesh-proxy" and attributes["a"] == "b c"
    (scope,) = resource_spans.scope_spans
    assert scope.scope.name == "inference-mesh" and len(scope.spans) == 2
    assert scope.spans[0].status.code == trace_pb2.Status.STATUS_CODE_UNSET
