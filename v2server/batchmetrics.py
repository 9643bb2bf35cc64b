"""Metrics of dynamic batching, apart from the request metrics (v2server/metrics.py): a
server that never batches (the proxy's gRPC door) does not list them."""

from __future__ import annotations

from protos.metric_types import Gauge, Histogram

BATCH_ROWS = Histogram(
    "v2_batch_rows",
    "Rows per model execution (after dynamic batching)",
    ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
QUEUE_DEPTH = Gauge("v2_queue_depth", "Requests waiting for a model execution", ["model"])
