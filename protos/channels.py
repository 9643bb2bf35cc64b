"""The v2 gRPC service's names and the channel options every caller uses."""

from __future__ import annotations

SERVICE_NAME = "inference.GRPCInferenceService"
"""The v2 service as gRPC (and grpc.health.v1) names it."""
METHOD_PREFIX = f"/{SERVICE_NAME}/"
"""Prefix of its method paths: METHOD_PREFIX + "ModelInfer"."""


STREAM_STATUS_PARAMETER = "status_code"
"""On a ModelStreamInfer answer with an error_message: the error's gRPC status code (int64);
the v2 stream response has no status of its own. Clients that do not know it ignore it."""
HTTP_STATUS_PARAMETER = "http_status"
"""On an error answer of the proxy's gRPC door (a ModelStreamInfer answer's parameter, int64;
a unary call's trailing metadata `http-status`): the status its REST door gives the same
failure, which one gRPC code may not tell apart (413 and 429 are both RESOURCE_EXHAUSTED)."""
HTTP_STATUS_METADATA = "http-status"
PUSHBACK_METADATA = "grpc-retry-pushback-ms"
"""On a refusal that says when to come back (REST's `Retry-After`): the milliseconds a
client's gRPC retry policy waits before its next attempt (gRFC A6), instead of its backoff."""
STREAM_CANCEL_PARAMETER = "cancel"
"""A stream message with this parameter (bool true) and a request's id cancels that request
if it is still running (it is then not answered)."""
STREAM_CANCEL_EXTENSION = "stream_cancellation"
"""Listed in ServerMetadata's extensions by servers that understand STREAM_CANCEL_PARAMETER."""
STREAM_DRAINED_METADATA = "stream-drained"
"""Trailing metadata (value "1") of a ModelStreamInfer call a draining server of ours ended:
the end says the server is going away, not that its streams carry few requests."""


def channel_options(max_message_mb: int = 64) -> list[tuple[str, int]]:
    """Options for channels talking to v2 services: their message size limit."""
    max_bytes = max_message_mb * 1024 * 1024
    return [
        ("grpc.max_receive_message_length", max_bytes),
        ("grpc.max_send_message_length", max_bytes),
    ]
