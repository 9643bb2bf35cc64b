"""The mesh's lock-free metric types expose exactly what prometheus-client's own would for the
same updates (text and OpenMetrics, exemplars included), and give way to prometheus-client's
classes when the proxy runs several workers."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

from protos import metric_types
from tests.procs import ROOT

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
TRACE = {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7"}


def _times_out(text: str) -> str:
    """Exposition without its wall-clock times (`_created` values, exemplars' timestamps)."""
    text = re.sub(r"(_created(?:\{[^}]*\})? )\S+", r"\1T", text)
    return re.sub(r"(# \{[^}]*\} \S+ )\S+", r"\1T", text)


def _both(update) -> tuple[str, str, str, str]:
    """`update(Counter, Gauge, Histogram, registry)` run on prometheus-client's types and on
    the mesh's: both registries' text and OpenMetrics exposition."""
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    update(prometheus_client.Counter, prometheus_client.Gauge, prometheus_client.Histogram, theirs)
    update(metric_types._Counter, metric_types._Gauge, metric_types._Histogram, ours)
    return (
        _times_out(generate_latest(theirs).decode()),
        _times_out(generate_latest(ours).decode()),
        _times_out(openmetrics(theirs).decode()),
        _times_out(openmetrics(ours).decode()),
    )


def test_a_histogram_exposes_what_prometheus_clients_would() -> None:
    def update(_counter, _gauge, histogram, registry) -> None:
        latency = histogram(
            "latency_seconds", "d", ["pipeline"], buckets=BUCKETS, registry=registry
        )
        for value in (0.0, 0.0005, 0.001, 0.0010001, 0.003, 0.2, 7, 30, 31, 1e9, float("inf")):
            latency.labels("digits").observe(value)
        latency.labels("digits").observe(0.004, TRACE)
        latency.labels("digits").observe(0.0041, {**TRACE, "span_id": "00f067aa0ba902b8"})
        latency.labels("ocr").observe(2.0, TRACE)
        latency.labels("empty")
        rows = histogram("rows", "d", buckets=(1, 2, 4), registry=registry)
        rows.observe(1)
        rows.observe(3)

    text_theirs, text_ours, open_theirs, open_ours = _both(update)
    assert 'latency_seconds_bucket{le="0.001",pipeline="digits"} 3.0' in text_ours
    assert 'latency_seconds_bucket{le="+Inf",pipeline="digits"} 13.0' in text_ours
    last = '{span_id="00f067aa0ba902b8",trace_id="4bf92f3577b34da6a3ce929d0e0e4736"} 0.0041'
    assert f'latency_seconds_bucket{{le="0.005",pipeline="digits"}} 7.0 # {last}' in open_ours
    assert text_ours == text_theirs
    assert open_ours == open_theirs


def test_counters_and_gauges_expose_what_prometheus_clients_would() -> None:
    def update(counter, gauge, _histogram, registry) -> None:
        requests = counter("requests", "d", ["status"], registry=registry)
        requests.labels("200").inc()
        requests.labels("200").inc(2.5, TRACE)
        requests.labels("503").inc(0)
        depth = gauge("depth", "d", ["model"], registry=registry)
        depth.labels("a").set(7)
        depth.labels("a").inc()
        depth.labels("a").dec(0.5)
        depth.labels("b").inc(3)
        read = gauge("read_at_scrape", "d", registry=registry)
        read.set_function(lambda: 42)

    text_theirs, text_ours, open_theirs, open_ours = _both(update)
    assert 'depth{model="a"} 7.5' in text_ours and "read_at_scrape 42.0" in text_ours
    assert text_ours == text_theirs
    assert open_ours == open_theirs


def test_a_counter_refuses_to_go_down_and_tests_read_its_value() -> None:
    counter = metric_types._Counter("c_total", "d", registry=CollectorRegistry())
    counter.inc(3)
    with pytest.raises(ValueError, match="non-negative"):
        counter.inc(-1)
    assert counter._value.get() == 3


def test_several_workers_get_prometheus_clients_file_backed_types(tmp_path) -> None:
    script = (
        "import prometheus_client\n"
        "from protos import metric_types as m\n"
        "assert m.MULTIPROCESS\n"
        "assert m.Histogram is prometheus_client.Histogram\n"
        "assert m.Counter is prometheus_client.Counter\n"
        "assert m.Gauge is prometheus_client.Gauge\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    assert not metric_types.MULTIPROCESS  # this process: one, so the lock-free types
    assert metric_types.Histogram is metric_types._Histogram


def test_the_job_callbacks_outcomes_are_series_before_any_callback() -> None:
    """The callbacks' alert divides rates of these series: one born at its first try, at its
    count when first scraped, has no rate, and the alert reads nothing."""
    code = "from proxy import metrics; print(metrics.exposition()[0].decode())"
    text = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for outcome in ("delivered", "refused", "failed"):
        assert f'proxy_job_callbacks_total{{outcome="{outcome}"}} 0.0' in text, outcome
