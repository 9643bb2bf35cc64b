"""The mesh dashboard's panels: each a title, a unit and its PromQL queries by legend
(dashboard.py writes them into mesh-dashboard.json; tests/observability/test_prometheus.py runs
every query against a real Prometheus scraping a running mesh)."""

from __future__ import annotations

from dataclasses import dataclass

RATE = "1m"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: dict[str, str]
    """Legend -> PromQL."""
    labels: tuple[str, ...] = ()
    """Labels every series of every query carries (what the test checks)."""
    description: str = ""


def _quantile(q: float, metric: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket[{RATE}])))"


PANELS = [
    Panel(
        "Requests per second, by pipeline",
        "reqps",
        {"{{pipeline}}": f"sum by (pipeline) (rate(proxy_requests_total[{RATE}]))"},
        ("pipeline",),
    ),
    Panel(
        "Errors per second, by pipeline and status",
        "reqps",
        {
            "{{pipeline}} {{status}}": (
                f'sum by (pipeline, status) (rate(proxy_requests_total{{status!="200"}}[{RATE}]))'
            )
        },
        ("pipeline", "status"),
        "Every answer but 200; 499 is a client that left.",
    ),
    Panel(
        "Latency p50 / p99, by pipeline",
        "s",
        {
            "p50 {{pipeline}}": _quantile(0.5, "proxy_request_duration_seconds", "pipeline"),
            "p99 {{pipeline}}": _quantile(0.99, "proxy_request_duration_seconds", "pipeline"),
        },
        ("pipeline",),
    ),
    Panel(
        "Latency p50 / p99, by step",
        "s",
        {
            "p50 {{pipeline}}/{{step}}": _quantile(
                0.5, "proxy_step_duration_seconds", "pipeline, step"
            ),
            "p99 {{pipeline}}/{{step}}": _quantile(
                0.99, "proxy_step_duration_seconds", "pipeline, step"
            ),
        },
        ("pipeline", "step"),
    ),
    Panel(
        "Admission refusals per second (503, 429), by pipeline",
        "reqps",
        {
            "{{pipeline}} {{status}}": (
                "sum by (pipeline, status) "
                f'(rate(proxy_requests_total{{status=~"503|429"}}[{RATE}]))'
            )
        },
        ("pipeline", "status"),
        "Requests told to come back: the proxy's or a pipeline's limits, a full queue.",
    ),
    Panel(
        "Requests in flight and bytes they hold",
        "short",
        {
            "requests": "sum(proxy_in_flight_requests)",
            "MiB": "sum(proxy_bytes_in_flight) / 1048576",
        },
    ),
    Panel(
        "Model queue depth, by model",
        "short",
        {"{{model}}": "sum by (model) (v2_queue_depth)"},
        ("model",),
    ),
    Panel(
        "Rows per model execution (dynamic batching), by model",
        "short",
        {
            "{{model}}": (
                f"sum by (model) (rate(v2_batch_rows_sum[{RATE}])) "
                f"/ (sum by (model) (rate(v2_batch_rows_count[{RATE}])) > 0)"
            )
        },
        ("model",),
    ),
    Panel(
        "Requests per merged call, by step",
        "short",
        {
            "{{step}}": (
                f"sum by (step) (rate(proxy_merged_call_members_sum[{RATE}])) "
                f"/ (sum by (step) (rate(proxy_merged_call_members_count[{RATE}])) > 0)"
            )
        },
        ("step",),
    ),
    Panel(
        "Service latency p99, by model",
        "s",
        {
            "{{model}}": (
                "histogram_quantile(0.99, sum by (model, le) "
                "(rate(v2_request_duration_seconds_bucket"
                f'{{method=~"ModelInfer|ModelStreamInfer", model!=""}}[{RATE}])))'
            )
        },
        ("model",),
    ),
    Panel(
        "Replicas passed over and calls hedged, by endpoint",
        "short",
        {
            "{{endpoint}} replicas passed over (per 5 min)": (
                "sum by (endpoint) (increase(proxy_replicas_passed_over_total[5m]))"
            ),
            "{{endpoint}} calls hedged (per s)": (
                f"sum by (endpoint) (rate(proxy_hedged_calls_total[{RATE}]))"
            ),
            "{{endpoint}} hedges won (per s)": (
                f"sum by (endpoint) (rate(proxy_hedges_won_total[{RATE}]))"
            ),
        },
        ("endpoint",),
        "Endpoints that name several replicas (dns:///, ipv4:a,b): a replica passed over "
        "failed or stalled and its calls went to the others; a hedged call was sent to a "
        "second replica as the first was late. Hedges that rarely win cost a second call "
        "for little (docs/services.md, Replicas).",
    ),
    Panel(
        "Cache lookups per second, by pipeline and result",
        "reqps",
        {
            "{{pipeline}} {{step}} {{result}}": (
                f"sum by (pipeline, step, result) (rate(proxy_cache_lookups_total[{RATE}]))"
            )
        },
        ("pipeline", "result"),
    ),
    Panel(
        "Shadows: answers like the live model's, by step and output",
        "percentunit",
        {
            "{{pipeline}} {{step}} {{output}}": (
                "sum by (pipeline, step, output) "
                f'(rate(proxy_shadow_outputs_total{{outcome="same"}}[{RATE}])) '
                "/ (sum by (pipeline, step, output) "
                f"(rate(proxy_shadow_outputs_total[{RATE}])) > 0)"
            )
        },
        ("pipeline", "step", "output"),
        "A step whose endpoint has a shadow (<VARIABLE>_SHADOW) sends a copy of its calls "
        "to a candidate: the share of the candidate's outputs equal to the live model's "
        "(floats within rtol 1e-3, atol 1e-5). For a classifier read its label "
        "(docs/services.md, Trying a candidate).",
    ),
    Panel(
        "Shadow copies per second, by step and outcome",
        "reqps",
        {
            "{{pipeline}} {{step}} {{outcome}}": (
                f"sum by (pipeline, step, outcome) (rate(proxy_shadow_calls_total[{RATE}]))"
            )
        },
        ("pipeline", "step", "outcome"),
        "answered; failed (the candidate's error or its budget); skipped (too many copies in "
        "flight: a slow candidate never holds the live requests)",
    ),
    Panel(
        "Canaries against the live model: calls per second, by step, variant and status",
        "reqps",
        {
            "{{pipeline}} {{step}} {{variant}} {{status}}": (
                "sum by (pipeline, step, variant, status) "
                f"(rate(proxy_canary_step_duration_seconds_count[{RATE}]))"
            )
        },
        ("pipeline", "step", "variant", "status"),
        "A step whose endpoint has a canary (<VARIABLE>_CANARY) sends that share of its calls "
        "to it: a status other than ok on the canary's side, and not on the live side, is the "
        "canary's (docs/services.md, Rolling out).",
    ),
    Panel(
        "Canaries against the live model: p99 latency, by step and variant",
        "s",
        {
            "{{pipeline}} {{step}} {{variant}}": _quantile(
                0.99, "proxy_canary_step_duration_seconds", "pipeline, step, variant"
            )
        },
        ("pipeline", "step", "variant"),
    ),
    Panel(
        "Jobs, by status",
        "short",
        {"{{status}}": "sum by (status) (proxy_jobs)"},
        ("status",),
    ),
    Panel(
        "Jobs finished per second, by pipeline and status",
        "reqps",
        {
            "{{pipeline}} {{status}}": (
                f"sum by (pipeline, status) (rate(proxy_jobs_finished_total[{RATE}]))"
            )
        },
        ("pipeline", "status"),
    ),
    Panel(
        "Job callbacks tried per second, by outcome",
        "reqps",
        {"{{outcome}}": f"sum by (outcome) (rate(proxy_job_callbacks_total[{RATE}]))"},
        ("outcome",),
        description="delivered; refused (a 4xx: not tried again); failed: tried again later",
    ),
    Panel(
        "Oldest queued job's wait",
        "s",
        {"oldest": "max(proxy_jobs_oldest_queued_seconds)"},
    ),
    Panel(
        "Prediction log records per second, by outcome",
        "reqps",
        {"{{outcome}}": f"sum by (outcome) (rate(proxy_prediction_log_records_total[{RATE}]))"},
        ("outcome",),
        description="written; dropped (its queue full: the sink is slower than the requests); "
        "failed (the sink refused, or could not be reached): PROXY_PREDICTION_LOG, "
        "docs/operating.md",
    ),
]
