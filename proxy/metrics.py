"""Prometheus metrics of the proxy."""

from __future__ import annotations

import os
from collections.abc import Callable

from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import REGISTRY

from protos.metric_types import MULTIPROCESS, Counter, Gauge, Histogram

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REQUESTS = Counter(
    "proxy_requests_total", "Pipeline requests by pipeline and HTTP status", ["pipeline", "status"]
)
LATENCY = Histogram(
    "proxy_request_duration_seconds", "Pipeline request latency", ["pipeline"], buckets=_BUCKETS
)
STEP_LATENCY = Histogram(
    "proxy_step_duration_seconds",
    "Latency of each pipeline step's calls; branch: a parallel step's branch ('' otherwise)",
    ["pipeline", "step", "branch", "status"],
    buckets=_BUCKETS,
)
# livesum: with several workers (PROXY_WORKERS) the sum over the live ones.
IN_FLIGHT = Gauge(
    "proxy_in_flight_requests", "Pipeline requests being served", multiprocess_mode="livesum"
)
BYTES_IN_FLIGHT = Gauge(
    "proxy_bytes_in_flight",
    "Bytes held by uploads and the tensors of requests in flight",
    multiprocess_mode="livesum",
)


def read_when_scraped(gauge: Gauge, read: Callable[[], float]) -> bool:
    """`gauge` made to read `read()` at each scrape, instead of being set on every change
    (~10 gauge writes a `digits` request); False with several workers, whose gauges are
    files written as they change (prometheus-client has no set_function there)."""
    if MULTIPROCESS:  # the gauge is prometheus-client's file-backed one
        return False
    gauge.set_function(read)
    return True


def exposition(accept: str | None = None) -> tuple[bytes, str]:
    """What /metrics answers and its content type: this process's metrics, or every
    worker's when the proxy runs several (prometheus-client's multiprocess directory); in
    the OpenMetrics format when the scraper asks for it (exemplars come only in it)."""
    encode, content_type = choose_encoder(accept)
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        return encode(REGISTRY), content_type
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return encode(registry), content_type


NOT_ANSWERING = Gauge(
    "proxy_endpoint_not_answering",
    "1 while an endpoint's calls fail at once: its calls got no answer, nor did a readiness "
    "check (proxy/transport/breaker.py)",
    ["endpoint"],
    multiprocess_mode="max",
)
PIPELINE_MISCONFIGURED = Gauge(
    "proxy_pipeline_misconfigured",
    "1 while a step of the pipeline does not fit its model as the model's metadata declares "
    "it: inputs it cannot take, outputs it does not have (proxy/engine/audit.py)",
    ["pipeline"],
    multiprocess_mode="max",
)
WAITING = Gauge(
    "proxy_requests_waiting",
    "Requests waiting for room in a pipeline at its limits (proxy/engine/room.py)",
    ["pipeline"],
    multiprocess_mode="livesum",
)
SHED = Counter(
    "proxy_requests_shed_total",
    "Requests refused at once (503) because the work ahead of them would outlast their budget",
    ["pipeline"],
)
HEDGED = Counter(
    "proxy_hedged_calls_total",
    "Calls sent to a second replica of an endpoint because the first had stalled "
    "(proxy/transport/hedging.py)",
    ["endpoint"],
)
HEDGES_WON = Counter(
    "proxy_hedges_won_total",
    "Hedged calls the second replica answered first (proxy/transport/hedging.py)",
    ["endpoint"],
)
REPLICAS_PASSED_OVER = Counter(
    "proxy_replicas_passed_over_total",
    "Times a replica of an endpoint began to be passed over: it failed (UNAVAILABLE, "
    "CANCELLED) or stalled where it had been answering (proxy/transport/balancing.py)",
    ["endpoint"],
)
CALLS_REFUSED = Counter(
    "proxy_calls_refused_total",
    "Calls not sent because their endpoint was not answering",
    ["endpoint"],
)

MERGED_MEMBERS = Histogram(
    "proxy_merged_call_members",
    "Requests' calls carried by each call to a batching model (1: sent alone)",
    ["step"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128),
)

CACHE_LOOKUPS = Counter(
    "proxy_cache_lookups_total",
    "Cache lookups by pipeline, step (empty: the whole answer) and result: hit, miss, "
    "or error (the store failed; the request went on without it)",
    ["pipeline", "step", "result"],
)
CACHE_STORED_BYTES = Counter(
    "proxy_cache_stored_bytes_total",
    "Bytes written to the cache, by pipeline and step",
    ["pipeline", "step"],
)
CACHE_UNADMITTED = Counter(
    "proxy_cache_unadmitted_total",
    "Computed answers not kept because their key was seen for the first time lately "
    "(cache.admit: second), by pipeline and step",
    ["pipeline", "step"],
)
CACHE_BYTES = Gauge(
    "proxy_cache_bytes",
    "Bytes an in-process cache holds, by store",
    ["store"],
    multiprocess_mode="livesum",
)
CACHE_EVICTIONS = Counter(
    "proxy_cache_evictions_total",
    "Entries an in-process cache dropped to stay within its bytes, by store",
    ["store"],
)

JOBS_SUBMITTED = Counter("proxy_jobs_submitted_total", "Jobs accepted, by pipeline", ["pipeline"])
JOB_ATTEMPTS = Counter(
    "proxy_job_attempts_total", "Job attempts started by this process, by pipeline", ["pipeline"]
)
JOBS_FINISHED = Counter(
    "proxy_jobs_finished_total",
    "Jobs whose final state this process wrote, by pipeline and state",
    ["pipeline", "status"],
)
JOB_CALLBACKS = Counter(
    "proxy_job_callbacks_total",
    "Tries of jobs' callbacks by this process, by outcome (delivered; refused, a 4xx: not "
    "tried again; failed: tried again later)",
    ["outcome"],
)
# Each outcome a series at 0 from the start: a series born at its first try, already at its
# count when first scraped, never shows a rate (the callbacks' alert then read nothing: a CI
# run's few callbacks all fell between two scrapes).
for _outcome in ("delivered", "refused", "failed"):
    JOB_CALLBACKS.labels(_outcome)
JOBS_WAITING = Gauge(
    "proxy_jobs",
    "Unfinished jobs in the queue's store, by state (queued, running)",
    ["status"],
    multiprocess_mode="max",
)
JOBS_OLDEST_S = Gauge(
    "proxy_jobs_oldest_queued_seconds",
    "Age of the oldest queued job",
    multiprocess_mode="max",
)
