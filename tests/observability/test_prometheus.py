"""The dashboard and the alert rules against a real Prometheus (Debian's, started here)
scraping a running mesh: every panel's query and every recorded series comes back non-empty,
each series with the labels its legend names; every rule evaluates without error (issue 29).

The traffic gives every panel something to show: digits and bad uploads on the mesh's proxy;
on a second proxy with its cache on and room for two requests, repeats (cache hits), a crowd
(admission refusals, 503) and jobs with callbacks (the first refused, then tried again); on a
fourth whose `mlp` names two replicas, one of them killed mid-run (passed over)."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench import prometheus_server
from deploy.observability.dashboard import DASHBOARD
from deploy.observability.dashboard import main as dashboard_main
from deploy.observability.panels import PANELS
from samples.images import encode, render_digit
from tests.callbacks import callbacks_received
from tests.conftest import Mesh
from tests.faults.load import run
from tests.procs import ROOT, Service, start_service
from tests.report import report

RULES = DASHBOARD.parent / "prometheus-rules.yaml"
BODY = encode(render_digit(np.eye(8) * 16))


def _miswired(mesh: Mesh) -> str:
    """The `mlp` branch re-pointed at the OCR recogniser, which takes no digit: every call
    of that branch fails (502, "pipeline misconfigured"), and `digits-partial` answers 200
    without it."""
    return f"127.0.0.1:{mesh.local.services['ocr-rec'].env['PREDICTOR_PORT']}/ocr_rec"


def _metrics_targets(mesh: Mesh) -> list[str]:
    targets = []
    for name, service in mesh.local.services.items():
        ports = [v for k, v in service.env.items() if k.endswith("_METRICS_PORT")]
        if name != "proxy" and ports:
            targets.append(f"127.0.0.1:{ports[0]}")
    return targets


@dataclass(frozen=True)
class Proxies:
    second: str
    """Its cache on, room for two requests, callbacks to `hook`."""
    hook: str
    third: str
    """Its `mlp` branch mis-wired."""
    fourth: str
    """Its `mlp` branch two replicas: the mesh's and `replica`."""
    replica: Service


@pytest.fixture(scope="module")
def prometheus(
    mesh: Mesh, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[prometheus_server.PrometheusServer, Proxies]]:
    """The Prometheus server scraping the mesh and three more proxies over its services (the
    fourth: two MLP replicas, one killed mid-run, a shadow of the logistic regression and a
    canary of the forest, and a prediction log)."""
    if not prometheus_server.available():
        message = "prometheus is missing (./mesh test installs it when run as root)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Prometheus test: {message}")
        pytest.skip(message)
    replica = _mlp_replica(tmp_path_factory.mktemp("replica"))
    mlp = mesh.local.services["digits-mlp"].env["PREDICTOR_PORT"]
    forest = mesh.local.services["digits-forest"].env["PREDICTOR_PORT"]
    try:
        with (
            callbacks_received(failures=1) as hook,  # one callback tried again: two outcomes
            mesh.extra_proxy(
                27780,
                PROXY_CACHE="true",
                PROXY_MAX_IN_FLIGHT="2",
                PROXY_JOBS_CALLBACK_HOSTS=hook.host,
            ) as second,
            mesh.extra_proxy(27781, PREDICTOR_DIGITS_MLP_URL=_miswired(mesh)) as third,
            mesh.extra_proxy(
                27782,
                PREDICTOR_DIGITS_MLP_URL=f"ipv4:127.0.0.1:{mlp},{replica.address}",
                # The shadows' panels: the logistic regression's calls copied to the MLP;
                # the canaries': half the forest's calls sent to another of its servers.
                PREDICTOR_DIGITS_LOGREG_URL_SHADOW=f"127.0.0.1:{mlp}/digits_mlp",
                PREDICTOR_DIGITS_FOREST_URL_CANARY=f"127.0.0.1:{forest}",
                PREDICTOR_DIGITS_FOREST_URL_CANARY_PERCENT="50",
                # The prediction log's panel and rule: its requests recorded.
                PROXY_PREDICTION_LOG=str(tmp_path_factory.mktemp("log") / "predictions.jsonl"),
            ) as fourth,
        ):
            urls = [mesh.url, second, third, fourth]
            jobs = {
                "mesh-proxy": [url.removeprefix("http://") for url in urls],
                "mesh-services": _metrics_targets(mesh),
            }
            server = prometheus_server.start(jobs, [RULES])
            try:
                yield server, Proxies(second, hook.url, third, fourth, replica)
            finally:
                server.stop()
    finally:
        replica.stop()


def _mlp_replica(workdir: Path) -> Service:
    args = ["--repository", str(ROOT / "models" / "repository"), "--models", "digits_mlp"]
    return start_service("predictors", [*args, "--host", "127.0.0.1"], workdir)


def _traffic(mesh: Mesh, proxies: Proxies) -> None:
    second, hook, third = proxies.second, proxies.hook, proxies.third
    infer = "/v1/pipelines/digits/infer"
    partial = third + "/v1/pipelines/digits-partial/infer"
    asyncio.run(run(mesh.url, infer, BODY, requests=400, concurrency=8, timeout_ms=3000))
    # Both replicas answer, then one dies: its calls fail over to the other, and it is passed
    # over (a counter already scraped at 0, so its increase shows).
    asyncio.run(run(proxies.fourth, infer, BODY, requests=100, concurrency=4, timeout_ms=3000))
    proxies.replica.stop(signal.SIGKILL)
    tally = asyncio.run(
        run(proxies.fourth, infer, BODY, requests=200, concurrency=4, timeout_ms=3000)
    )
    assert tally.by_status == {200: tally.sent}, (tally.by_status, tally.bodies)
    with httpx.Client(timeout=10) as client:
        for _ in range(5):  # 415: what a client sends wrong shows as an error too
            client.post(
                mesh.url + infer, content=b"not an image", headers={"Content-Type": "image/png"}
            )
            client.post(second + infer, content=BODY, headers={"Content-Type": "image/png"})
        for _ in range(3):
            answer = client.post(
                second + "/v1/pipelines/digits/jobs",
                params={"callback": hook},
                content=BODY,
                headers={"Content-Type": "image/png"},
            )
            assert answer.status_code == 202, answer.text

    def crowd(i: int) -> int:
        page = np.full((600, 800, 3), 255, np.uint8)
        page[0, i] = 0  # each its own: no cache hit, no shared run
        with httpx.Client(timeout=10) as client:
            return client.post(
                second + "/v1/pipelines/ocr/infer",
                content=encode(page),
                headers={"Content-Type": "image/png"},
            ).status_code

    # Two crowds a few scrapes apart: Prometheus sees a counter's increase only between two
    # samples, and a status's series is born at its first answer, so refusals that all fall
    # between two scrapes would show no rate.
    def degraded(i: int) -> int:
        image = BODY if i % 2 else encode(render_digit(np.eye(8)[::-1] * 16))
        with httpx.Client(timeout=10) as client:
            answer = client.post(partial, content=image, headers={"Content-Type": "image/png"})
            return answer.status_code if not answer.json().get("partial") else 206

    statuses: set[int] = set()
    with ThreadPoolExecutor(12) as pool:
        statuses |= set(pool.map(crowd, range(36)))
        statuses |= set(pool.map(degraded, range(10)))
        time.sleep(2.5)
        statuses |= set(pool.map(crowd, range(36, 72)))
        statuses |= set(pool.map(degraded, range(10)))
    assert 503 in statuses and 206 in statuses, statuses


def _errors(server: prometheus_server.PrometheusServer) -> dict[str, float]:
    return {
        s["metric"]["pipeline"]: float(s["value"][1])
        for s in server.query("mesh:pipeline_server_errors:ratio_rate5m")
    }


def _failing(server: prometheus_server.PrometheusServer) -> dict[tuple[str, ...], float]:
    """(pipeline, step, branch) -> the share of its calls that failed."""
    return {
        (s["metric"]["pipeline"], s["metric"]["step"], s["metric"].get("branch", "")): float(
            s["value"][1]
        )
        for s in server.query("mesh:step_failures:ratio_rate5m")
    }


def _passed_over(server: prometheus_server.PrometheusServer) -> dict[str, float]:
    """endpoint -> its replicas' pass-overs in 10 minutes (the most a proxy saw), as recorded."""
    return {
        s["metric"]["endpoint"]: float(s["value"][1])
        for s in server.query("mesh:replicas_passed_over:max_increase10m")
    }


def _numbers(series: list[dict]) -> bool:
    """A number in some series (a quantile of a label idle for the window is NaN)."""
    return any(math.isfinite(float(s["value"][1])) for s in series)


def test_every_panel_and_rule_has_labelled_series(
    mesh: Mesh, prometheus: tuple[prometheus_server.PrometheusServer, Proxies]
) -> None:
    server, proxies = prometheus
    assert dashboard_main(["--check"]) == 0, "mesh-dashboard.json is not what dashboard.py writes"
    expected = 4 + len(_metrics_targets(mesh))
    deadline = time.monotonic() + 30  # Prometheus applies its targets ~5 s after it starts
    while len(targets := server.targets()) < expected or any(t["health"] != "up" for t in targets):
        assert time.monotonic() < deadline, [(t["scrapeUrl"], t["lastError"]) for t in targets]
        time.sleep(0.5)
    time.sleep(1.5)  # every counter scraped once before the traffic: its rate is then seen
    _traffic(mesh, proxies)
    replicated = f"ipv4:127.0.0.1:{mesh.local.services['digits-mlp'].env['PREDICTOR_PORT']},"

    queries = [(p, legend, expr) for p in PANELS for legend, expr in p.queries.items()]
    deadline = time.monotonic() + 40
    empty: list[str] = []
    while time.monotonic() < deadline:  # two scrapes inside every rate's window, and the rules
        empty = [expr for _, _, expr in queries if not _numbers(server.query(expr))]
        records = [r for r in server.rules() if r["type"] == "recording"]
        empty += [r["name"] for r in records if not _numbers(server.query(r["name"]))]
        if _errors(server).get("ocr", 0) <= 0:
            empty.append("mesh:pipeline_server_errors:ratio_rate5m{pipeline='ocr'}")
        if _failing(server).get(("digits-partial", "ensemble", "mlp"), 0) <= 0.05:
            empty.append("mesh:step_failures:ratio_rate5m{pipeline='digits-partial'}")
        if not any(e.startswith(replicated) and n > 0 for e, n in _passed_over(server).items()):
            empty.append(f"mesh:replicas_passed_over:max_increase10m{{endpoint='{replicated}...'}}")
        if not empty:
            break
        time.sleep(1)
    assert not empty, f"queries with no series, or not a number: {empty}"
    for panel, legend, expr in queries:
        for series in server.query(expr):
            labels = series["metric"]
            missing = [name for name in panel.labels if not labels.get(name)]
            assert not missing, (panel.title, legend, labels)
    rules = server.rules()
    assert len(rules) == 27
    unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not unhealthy, unhealthy
    # The recorded series each alert compares carry what its summary names.
    by_name = {r["name"]: r for r in rules}
    for record, label in (
        ("mesh:pipeline_server_errors:ratio_rate5m", "pipeline"),
        ("mesh:pipeline_latency_p99:5m", "pipeline"),
        ("mesh:step_latency_p99:5m", "step"),
        ("mesh:step_failures:ratio_rate5m", "step"),
        ("mesh:model_queue_depth:max", "model"),
        ("mesh:endpoint_not_answering:max", "endpoint"),
        ("mesh:replicas_passed_over:max_increase10m", "endpoint"),
        ("mesh:model_load_failing:max", "model"),
        ("mesh:pipeline_misconfigured:max", "pipeline"),
    ):
        assert record in by_name
        assert all(s["metric"].get(label) for s in server.query(record)), record
    errors = _errors(server)
    assert errors.get("ocr", 0) > 0, errors  # the crowd's refusals on the second proxy
    # The mis-wired branch: each of its calls fails while the answers are 200 (partial);
    # the alert is on its way (pending its 10 minutes), for no other branch or step.
    failing = _failing(server)
    assert failing[("digits-partial", "ensemble", "mlp")] == 1, failing
    assert failing.get(("digits-partial", "ensemble", "logreg")) == 0, failing
    assert failing.get(("digits", "preprocess", ""), 0) == 0, failing
    deadline = time.monotonic() + 10  # the alerts' group evaluates after the records'
    while True:
        [step_alert] = [r for r in server.rules() if r["name"] == "MeshStepFailing"]
        pending = {
            (a["labels"]["pipeline"], a["labels"]["step"], a["labels"].get("branch"))
            for a in step_alert["alerts"]
        }
        if pending or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert pending == {("digits-partial", "ensemble", "mlp")}, step_alert["alerts"]
    # The third proxy's audit found the re-pointed branch without a request's help: in the
    # three pipelines whose ensemble has it, and no other.
    misconfigured = {
        s["metric"]["pipeline"]: float(s["value"][1])
        for s in server.query("mesh:pipeline_misconfigured:max")
    }
    wrong = {p for p, v in misconfigured.items() if v > 0}
    assert wrong == {"digits", "digits-partial", "digits-features"}, misconfigured
    assert misconfigured.get("ocr") == 0, misconfigured
    up = server.query('up{job=~"mesh-.*"}')
    assert len(up) == len(targets) and {s["value"][1] for s in up} == {"1"}
    report(
        f"\nprometheus: {len(queries)} panel queries and {len(rules)} rules over "
        f"{len(targets)} targets, every one with labelled series"
    )
