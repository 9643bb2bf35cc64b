"""Scenario 5: a slow step in a serial chain. The request's budget holds end to end and the
steps after the slow one are never called. Every service is a real process; the slow step
is a relay process (tests/faults/slow_relay.py) holding each call in front of a real
predictor."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from samples.images import text_samples
from tests.conftest import Mesh
from tests.faults.load import run
from tests.faults.test_faults import BODY
from tests.procs import Service, metric, metric_of, start_service
from tests.report import report

pytestmark = pytest.mark.alone  # how the mesh holds under load: no other test beside it

DELAY_MS = 400
BUDGET_MS = 250
CHAIN_PORT = 27280
OCR_PORT = 27281

# preprocess -> logreg (through the slow relay) -> mlp -> forest: each step a real service.
CHAIN = {
    "pipelines": {
        "chain": {
            "input": "image",
            "timeout_ms": 3000,
            "steps": [
                {
                    "call": {
                        "name": "preprocess",
                        "endpoint": "PREPROCESS_URL",
                        "model": "digits_input",
                        "inputs": {"image": "request.image"},
                    }
                },
                *(
                    {
                        "call": {
                            "name": name,
                            "endpoint": f"CHAIN_{name.upper()}_URL",
                            "model": f"digits_{name}",
                            "inputs": {"input": "preprocess.input"},
                        }
                    }
                    for name in ("logreg", "mlp", "forest")
                ),
            ],
            "result": {"label": "forest.label[0]"},
        }
    }
}


def _infer_count(mesh: Mesh, service: str, model: str) -> float:
    """ModelInfer calls a service has answered, whatever their status."""
    env = mesh.local.services[service].env
    port = next(v for k, v in env.items() if k.endswith("METRICS_PORT"))
    return metric(port, "v2_requests_total", method="ModelInfer", model=model)


def _grpc_port(mesh: Mesh, service: str) -> str:
    env = mesh.local.services[service].env
    return next(v for k, v in env.items() if k.endswith("_PORT") and "METRICS" not in k)


def _relay(mesh: Mesh, service: str, workdir: Path, delay_ms: int = DELAY_MS) -> Service:
    upstream = f"127.0.0.1:{_grpc_port(mesh, service)}"
    return start_service(
        "tests.faults.slow_relay", ["--upstream", upstream, "--delay-ms", str(delay_ms)], workdir
    )


def _merged_calls(url: str) -> tuple[float, float]:
    """(calls, requests' calls in them) the proxy made to the slow step."""
    return (
        metric_of(url, "proxy_merged_call_members_count", step="logreg"),
        metric_of(url, "proxy_merged_call_members_sum", step="logreg"),
    )


def _late(url: str) -> float:
    """Requests whose slow step ended out of time, as the proxy's step histogram counts."""
    return metric_of(
        url,
        "proxy_step_duration_seconds_count",
        pipeline="chain",
        step="logreg",
        status="deadline_exceeded",
    )


def _relay_counts(relay: Service) -> dict[str, int]:
    assert relay.stop() == 0
    found = re.search(r"relay: received (\d+), forwarded (\d+), abandoned (\d+)", relay.log())
    assert found, relay.log()
    return dict(zip(("received", "forwarded", "abandoned"), map(int, found.groups()), strict=True))


def _chain_env(mesh: Mesh, tmp_path: Path, relay: Service, **limits: int) -> dict[str, str]:
    """A proxy's environment for CHAIN through `relay`, with the pipeline's `limits`."""
    pipelines = tmp_path / "chain.yaml"
    chain = {**CHAIN["pipelines"]["chain"], **limits}
    pipelines.write_text(yaml.safe_dump({"pipelines": {"chain": chain}}))
    return {
        "PROXY_PIPELINES": str(pipelines),
        "CHAIN_LOGREG_URL": relay.address,
        "CHAIN_MLP_URL": f"127.0.0.1:{_grpc_port(mesh, 'digits-mlp')}",
        "CHAIN_FOREST_URL": f"127.0.0.1:{_grpc_port(mesh, 'digits-forest')}",
    }


def test_slow_middle_step_under_load(mesh: Mesh, tmp_path: Path) -> None:
    relay = _relay(mesh, "digits-logreg", tmp_path)
    # Every request sent on to the slow step, to see each run out of time there: without
    # shedding (the next test turns it on), which refuses most of them before they are sent.
    env = {**_chain_env(mesh, tmp_path, relay), "PROXY_SHED_LATE": "false"}
    try:
        with mesh.extra_proxy(CHAIN_PORT, **env) as url:
            # With time to spare the chain runs through the slow step to the end.
            r = httpx.post(
                f"{url}/v1/pipelines/chain/infer",
                content=BODY,
                headers={"Content-Type": "image/png"},
                timeout=10,
            )
            assert r.status_code == 200, r.text
            assert [s["name"] for s in r.json()["steps"]] == [
                "preprocess",
                "logreg",
                "mlp",
                "forest",
            ]
            later = {m: _infer_count(mesh, f"digits-{m}", f"digits_{m}") for m in ("mlp", "forest")}
            merged = _merged_calls(url)
            late = _late(url)
            tally = asyncio.run(
                run(
                    url,
                    "/v1/pipelines/chain/infer",
                    BODY,
                    requests=1000,
                    concurrency=16,
                    timeout_ms=BUDGET_MS,
                    margin_s=0.5,
                )
            )
            after = {m: _infer_count(mesh, f"digits-{m}", f"digits_{m}") for m in ("mlp", "forest")}
            calls, members = (a - b for a, b in zip(_merged_calls(url), merged, strict=True))
            timed_out = _late(url) - late
    finally:
        counts = _relay_counts(relay)
    report(
        "\n" + tally.summary(f"slow step ({DELAY_MS} ms) in a 4-step chain, {BUDGET_MS} ms budget")
    )
    report(f"relay: {counts}; later steps' calls during the load: {after} vs {later} before")
    assert tally.lost == 0 and tally.hung == 0
    assert tally.by_status == {504: 1000}
    assert max(tally.latencies) < BUDGET_MS / 1000 + 0.5, "an answer outlived its budget"
    assert after == later, "a step after the slow one was called"
    # Every request reached the slow step and ran out of time there (sent alone or in a
    # call merged with others, or still queued for one), and none went past it.
    assert timed_out == 1000
    assert counts["received"] - 1 <= calls and members <= 1000
    # (A call whose members all ran out of time while it was being written may never arrive.)
    assert counts["forwarded"] == 1 and 0 < counts["received"] - 1 <= calls
    assert counts["abandoned"] == counts["received"] - 1


def test_requests_a_slow_step_cannot_answer_in_time_are_refused_at_once(
    mesh: Mesh, tmp_path: Path
) -> None:
    relay = _relay(mesh, "digits-logreg", tmp_path)
    try:
        env = {**_chain_env(mesh, tmp_path, relay), "PROXY_SHED_LATE": "true"}
        with mesh.extra_proxy(CHAIN_PORT, **env) as url:
            tally = asyncio.run(
                run(
                    url,
                    "/v1/pipelines/chain/infer",
                    BODY,
                    requests=400,
                    concurrency=16,
                    timeout_ms=BUDGET_MS,
                    margin_s=0.5,
                )
            )
            shed = metric_of(url, "proxy_requests_shed_total", pipeline="chain")
    finally:
        counts = _relay_counts(relay)
    report(tally.summary(f"slow step ({DELAY_MS} ms), {BUDGET_MS} ms budgets, shedding on"))
    report(f"relay with shedding: {counts}")
    assert tally.lost == 0 and tally.hung == 0
    assert set(tally.by_status) <= {503, 504}, tally.by_status
    # Once the pipeline's pace shows a request takes longer than its budget, the next are
    # refused before any call: the slow service is spared the work no one would get.
    assert tally.by_status[503] == shed >= 300, tally.by_status
    assert all(b"would not answer within the request's budget" in b for b in tally.bodies[503])
    assert counts["received"] <= 100, counts


@pytest.fixture(scope="module")
def page() -> bytes:
    blob, _ = text_samples(1, seed=3)[0]
    return blob


def test_slow_detector_in_the_ocr_chain(mesh: Mesh, tmp_path: Path, page: bytes) -> None:
    relay = _relay(mesh, "ocr-det", tmp_path)
    later = {
        "crops": ("preprocess", "ocr_crops"),
        "cls": ("ocr-cls", "ocr_cls"),
        "rec": ("ocr-rec", "ocr_rec"),
    }
    try:
        with mesh.extra_proxy(OCR_PORT, PREDICTOR_OCR_DET_URL=relay.address) as url:
            before = {k: _infer_count(mesh, *v) for k, v in later.items()}
            with httpx.Client(base_url=url, timeout=30) as client:
                answers = [
                    client.post(
                        "/v1/pipelines/ocr/infer",
                        files={"file": ("page.png", page)},
                        headers={"X-Request-Timeout-Ms": "300"},
                    )
                    for _ in range(10)
                ]
                after = {k: _infer_count(mesh, *v) for k, v in later.items()}
                slow_but_allowed = client.post(
                    "/v1/pipelines/ocr/infer", files={"file": ("page.png", page)}
                )
    finally:
        counts = _relay_counts(relay)
    assert [a.status_code for a in answers] == [504] * 10
    assert all(a.json()["step"] == "det" for a in answers), answers[0].text
    assert all(a.elapsed.total_seconds() < 0.3 + 0.25 for a in answers)
    assert after == before, "a step after the slow detector was called"
    assert slow_but_allowed.status_code == 200, slow_but_allowed.text
    assert np.array(slow_but_allowed.json()["result"]["lines"][0]["box"]).shape == (4, 2)
    assert counts["forwarded"] == 1
