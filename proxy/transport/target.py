"""Where one call goes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """Where one call goes: the endpoint's variable, its address, the model and version."""

    endpoint: str
    """The environment variable the address came from (errors and /readyz name it)."""
    address: str
    """host:port of a v2 gRPC server, or a gRPC name for its replicas (dns:///, ipv4:)."""
    model: str
    version: str = ""
