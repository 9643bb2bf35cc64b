"""Faults under bounded load: every request gets exactly one answer, in time, and the mesh
heals by itself. Services are the real processes of the shipped topology."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from samples.images import encode, render_digit
from tests.conftest import Mesh
from tests.faults.load import run
from tests.procs import metric_of
from tests.report import report

pytestmark = pytest.mark.alone  # how the mesh holds under load: no other test beside it

BODY = encode(render_digit(np.eye(8) * 16))


def _later(delay: float, action) -> threading.Timer:
    timer = threading.Timer(delay, action)
    timer.start()
    return timer


OLD_PATH = {"PROXY_TRANSPORT": "unary", "PROXY_MERGE": "false"}
"""The proxy's calls before streams and merged calls (the mesh's own proxy uses both)."""


def _ready_status(url: str) -> int:
    return httpx.get(f"{url}/readyz", timeout=60).status_code


@contextmanager
def _proxy_on(mesh: Mesh, path: str) -> Iterator[str]:
    """The mesh's proxy ("new"), or a second one on the old path over the same services."""
    if path == "new":
        yield mesh.url
    else:
        with mesh.extra_proxy(27380, **OLD_PATH) as url:
            yield url


@pytest.mark.parametrize(
    ("pipeline", "path"), [("digits", "new"), ("digits-partial", "new"), ("digits", "old")]
)
def test_killed_predictor(mesh: Mesh, pipeline: str, path: str) -> None:
    """SIGKILL one branch mid-load, restart it two seconds later."""
    with _proxy_on(mesh, path) as url:
        _killed_predictor(mesh, url, pipeline, path)


def _killed_predictor(mesh: Mesh, url: str, pipeline: str, path: str) -> None:
    proc = mesh.local.procs["digits-mlp"]
    observed: dict[str, int] = {}

    def kill() -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        observed["ready_during"] = _ready_status(url)

    def restart() -> None:
        mesh.local.start("digits-mlp")

    timers = [_later(1.0, kill), _later(3.0, restart)]
    try:
        tally = asyncio.run(
            run(
                url,
                f"/v1/pipelines/{pipeline}/infer",
                BODY,
                requests=1500,
                concurrency=16,
                timeout_ms=2000,
                min_duration_s=7.0,  # killed at 1 s, restarted at 3 s, healed before the end
            )
        )
    finally:
        for t in timers:
            t.join()
        mesh.local.wait_healthy("digits-mlp", 60)
    report(tally.summary(f"killed predictor, {pipeline}" + (", old path" if path == "old" else "")))
    assert tally.lost == 0 and tally.hung == 0
    assert tally.sent == sum(tally.by_status.values())
    allowed = {200, 503} if pipeline == "digits" else {200}
    assert set(tally.by_status) <= allowed, tally.by_status
    assert observed["ready_during"] == 503
    if pipeline == "digits":
        assert tally.by_status[503] > 0, "the outage must show"
    # Healed without restarting the proxy: the last answers are 200 again.
    assert [s for _, s in tally.timeline[-20:]] == [200] * 20
    deadline = time.monotonic() + 10
    while _ready_status(url) != 200:
        assert time.monotonic() < deadline, "/readyz did not recover"
        time.sleep(0.2)


class ProxyWatch(threading.Thread):
    """Samples the proxy's in-flight gauge and resident memory until stopped."""

    def __init__(self, mesh: Mesh) -> None:
        super().__init__(daemon=True)
        self.mesh = mesh
        self.pid = mesh.local.procs["proxy"].pid
        self.in_flight: list[float] = []
        self.rss_mb: list[float] = []
        self.done = threading.Event()

    def sample(self) -> None:
        self.in_flight.append(metric_of(self.mesh.url, "proxy_in_flight_requests"))
        status = Path(f"/proc/{self.pid}/status").read_text()
        self.rss_mb.append(int(status.split("VmRSS:")[1].split()[0]) / 1024)

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.sample()


def test_hung_predictor(mesh: Mesh) -> None:
    """SIGSTOP one branch for three seconds: answers stay within the deadline + margin, and
    nothing piles up in the proxy (in-flight requests and memory stay bounded). Once the
    branch's calls and a readiness check got no answer, `digits` fails at once (503) rather
    than at its deadline (504), until the branch answers again (proxy/transport/breaker.py)."""
    proc = mesh.local.procs["digits-forest"]
    watch = ProxyWatch(mesh)
    watch.sample()
    watch.start()
    timers = [
        _later(1.0, lambda: proc.send_signal(signal.SIGSTOP)),
        _later(4.0, lambda: proc.send_signal(signal.SIGCONT)),
    ]
    try:
        strict, partial = asyncio.run(_both(mesh))
    finally:
        for t in timers:
            t.join()
        proc.send_signal(signal.SIGCONT)
        watch.done.set()
        watch.join()
    time.sleep(0.5)
    watch.sample()
    for name, tally in (("digits", strict), ("digits-partial", partial)):
        report(tally.summary(f"hung predictor, {name}"))
        assert tally.lost == 0 and tally.hung == 0
        assert max(tally.latencies) < 0.8 + 0.5, "an answer came later than its deadline"
    assert set(strict.by_status) <= {200, 503, 504} and strict.by_status[504] > 0
    assert strict.by_status[503] > 0, "calls to the frozen branch never failed at once"
    assert all(b"is not answering" in answer for answer in strict.bodies[503])
    assert set(partial.by_status) == {200}
    growth = max(watch.rss_mb) - watch.rss_mb[0]
    report(
        f"hung predictor, proxy: in-flight max {max(watch.in_flight):.0f} (16 clients), "
        f"{watch.in_flight[-1]:.0f} after; memory {watch.rss_mb[0]:.0f} MB, +{growth:.0f} MB max"
    )
    assert max(watch.in_flight) <= 16 and watch.in_flight[-1] == 0
    assert growth < 64, "the proxy's memory grew while a branch hung"


async def _both(mesh: Mesh):
    return await asyncio.gather(
        run(
            mesh.url,
            "/v1/pipelines/digits/infer",
            BODY,
            requests=600,
            concurrency=8,
            timeout_ms=800,
            min_duration_s=5.0,  # stopped from 1 s to 4 s
            margin_s=0.5,
        ),
        run(
            mesh.url,
            "/v1/pipelines/digits-partial/infer",
            BODY,
            requests=600,
            concurrency=8,
            timeout_ms=800,
            min_duration_s=5.0,  # stopped from 1 s to 4 s
            margin_s=0.5,
        ),
    )


@pytest.mark.parametrize("service", ["digits-logreg", "preprocess"])
def test_graceful_shutdown_under_load(mesh: Mesh, service: str) -> None:
    """SIGTERM a service mid-load: accepted calls finish, new ones fail fast, never a 500."""
    proc = mesh.local.procs[service]
    timers = [_later(1.0, lambda: proc.send_signal(signal.SIGTERM))]
    try:
        tally = asyncio.run(
            run(
                mesh.url,
                "/v1/pipelines/digits/infer",
                BODY,
                requests=800,
                concurrency=16,
                timeout_ms=2000,
                min_duration_s=3.0,  # SIGTERM at 1 s
            )
        )
    finally:
        for t in timers:
            t.join()
        code = proc.wait(30)
        mesh.local.start(service)
        mesh.local.wait_healthy(service, 60)
    report(tally.summary(f"SIGTERM {service}, digits"))
    assert code == 0, "the service exits cleanly after draining"
    assert tally.lost == 0 and tally.hung == 0
    assert set(tally.by_status) <= {200, 503}, (tally.by_status, tally.bodies)
    assert tally.by_status[503] > 0
    assert max(tally.latencies) < 2.0


def test_overload_is_shed_quickly_then_served(mesh: Mesh) -> None:
    """Far more concurrency than a proxy admits: fast 503 + Retry-After, then normal service."""
    with mesh.extra_proxy(27180, wait_for="/healthz", PROXY_MAX_IN_FLIGHT="8") as url:
        flood = asyncio.run(
            run(
                url,
                "/v1/pipelines/digits/infer",
                BODY,
                requests=1200,
                concurrency=96,
                timeout_ms=3000,
            )
        )
        calm = asyncio.run(
            run(
                url,
                "/v1/pipelines/digits/infer",
                BODY,
                requests=100,
                concurrency=4,
                timeout_ms=3000,
            )
        )
    report(flood.summary("overload, 96 concurrent vs 8 admitted"))
    report(calm.summary("after the overload, 4 concurrent"))
    assert flood.lost == 0 and flood.hung == 0
    assert set(flood.by_status) <= {200, 503} and flood.by_status[503] > 0
    shed_latency = [
        lat for (_, s), lat in zip(flood.timeline, flood.latencies, strict=True) if s == 503
    ]
    assert float(np.median(shed_latency)) < 0.5, "shedding must be quick"
    assert calm.by_status == {200: 100}
