"""The v2 gRPC service's names and the channel options every caller uses."""

from __future__ import annotations

SERVICE_NAME = "inference.GRPCInferenceService"
"""The v2 service as gRPC (and grpc.health.v1) names it."""
METHOD_PREFIX = f"/{SERVICE_NAME}/"
"""Prefix of its method paths: METHOD_PREFIX + "ModelInfer"."""


def channel_options(max_message_mb: int = 64) -> list[tuple[str, int]]:
    """Options for channels talking to v2 services: their message size limit."""
    max_bytes = max_message_mb * 1024 * 1024
    return [
        ("grpc.max_receive_message_length", max_bytes),
        ("grpc.max_send_message_length", max_bytes),
    ]
