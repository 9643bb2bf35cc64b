"""The proxy (its own rooms: tests/unit/test_rooms.py) stands on the protocol library, and
on the server core only for its v2 gRPC door (pipelines as models): never on the services
or on the batcher, and its /metrics lists what it records only (it used to list the
services' batching metrics too)."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Mesh
from tests.procs import ROOT, metric_of


def test_the_proxy_never_imports_the_services_or_the_batcher() -> None:
    check = (
        "import sys, proxy.app, proxy.__main__; "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('predictors', 'preprocess', 'onnxruntime', 'cv2') or m in "
        "('v2server.batcher', 'v2server.served', 'v2server.batchmetrics', "
        "'v2server.control')); "
        "print(loaded); sys.exit(bool(loaded))"
    )
    done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_proxys_metrics_are_its_own(mesh: Mesh) -> None:
    with mesh.client() as client:
        client.post(
            "/v1/pipelines/digits/infer", content=b"x", headers={"Content-Type": "image/png"}
        )
        text = client.get("/metrics").text
    names = {f.name for f in text_string_to_metric_families(text)}
    ours = {n for n in names if n.startswith("proxy_")}
    assert {"proxy_requests", "proxy_request_duration_seconds", "proxy_bytes_in_flight"} <= ours
    # The gRPC door's requests (v2_requests, v2_request_duration_seconds), nothing else.
    assert {n.removesuffix("_created") for n in names if n.startswith("v2_")} <= {
        "v2_requests",
        "v2_request_duration_seconds",
    }, names


def test_the_proxys_garbage_collector_is_set_for_serving(mesh: Mesh) -> None:
    """protos/heap.py: start-up's objects frozen out of the full passes (~65 ms each over
    them), and young collections a tenth as often as CPython's default (one every ~4
    `digits` requests at 700, ~7% of the proxy's CPU)."""
    from bench.cache import digit, uploads

    photos = uploads(digit(), 0, 300)  # each with bytes of its own: never a cache hit

    def young() -> float:
        return metric_of(mesh.url, "python_gc_collections_total", generation="0")

    assert metric_of(mesh.url, "python_gc_frozen_objects") > 10_000
    before = young()
    with mesh.client() as client:
        for photo in photos:
            answer = client.post(
                "/v1/pipelines/digits/infer", content=photo, headers={"Content-Type": "image/png"}
            )
            assert answer.status_code == 200, answer.text
    # Sequential requests: one young collection every ~15 at CPython's default (13 in 200),
    # one in 200 at protos/heap.py's (under load: every ~4 at the default).
    assert young() - before < 8
