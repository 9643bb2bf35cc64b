"""Prometheus metrics of the v2 services, served on their own HTTP port."""

from __future__ import annotations

import grpc
from prometheus_client import start_http_server

from protos.labelled import child
from protos.metric_types import Counter, Histogram

REQUESTS = Counter(
    "v2_requests_total",
    "v2 gRPC requests by method, model and status code",
    ["method", "model", "code"],
)
LATENCY = Histogram(
    "v2_request_duration_seconds",
    "v2 gRPC handler latency",
    ["method", "model"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


class BindError(Exception):
    """A port the service was told to serve on cannot be bound; the message names it."""


def serve_metrics(host: str, port: int) -> int:
    """Start the /metrics HTTP server in a daemon thread; return its bound port."""
    try:
        server, _thread = start_http_server(port, addr=host)
    except OSError as exc:
        raise BindError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
    return int(server.server_port)


SERVED: set[str] = set()
"""Names of the models this process serves (set once they are loaded)."""


def record(
    method: str,
    model: str,
    code: grpc.StatusCode,
    seconds: float,
    exemplar: dict[str, str] | None = None,
) -> None:
    """One answered request (a unary call or one message of a stream); `exemplar`: its
    trace (traces on)."""
    # A model name is caller input: only served names become label values (a label per
    # unique name let 300 requests grow /metrics to 1.5 GB). The rest share "".
    if model not in SERVED:
        model = ""
    child(REQUESTS, method, model, code.name).inc()
    child(LATENCY, method, model).observe(seconds, exemplar)
