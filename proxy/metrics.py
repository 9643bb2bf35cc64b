"""Prometheus metrics of the proxy."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REQUESTS = Counter(
    "proxy_requests_total", "Pipeline requests by pipeline and HTTP status", ["pipeline", "status"]
)
LATENCY = Histogram(
    "proxy_request_duration_seconds", "Pipeline request latency", ["pipeline"], buckets=_BUCKETS
)
STEP_LATENCY = Histogram(
    "proxy_step_duration_seconds",
    "Latency of each pipeline step",
    ["pipeline", "step", "status"],
    buckets=_BUCKETS,
)
IN_FLIGHT = Gauge("proxy_in_flight_requests", "Pipeline requests being served")
BYTES_IN_FLIGHT = Gauge(
    "proxy_bytes_in_flight", "Bytes held by uploads and the tensors of requests in flight"
)
