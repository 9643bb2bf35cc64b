"""A branch whose only endpoint stops answering under load (its packets dropped inside its
network namespace, or the process frozen by SIGSTOP): `digits-partial` answers from the
other branches at once, not at its deadline, and the branch serves again once it heals
(proxy/transport/breaker.py). Before it, every request waited its whole budget (3 s) for
the silent branch: 8 clients got ~3 answers a second, where they got ~1,000."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Mesh
from tests.faults import netns
from tests.faults.load import load_with_events
from tests.faults.test_stalled_replica import (
    BODY,
    FAULTS,
    VARIABLE,
    WINDOW_S,
    _rows,
    isolated_predictor,
)
from tests.procs import Service, metric_of
from tests.report import report

pytestmark = pytest.mark.alone  # how the mesh holds under load: no other test beside it

HEALTHY_S, FAULT_S, AFTER_S = 3.0, 10.0, 4.0
NOTICED_S = 4.0
"""From the fault to calls failing at once, with room: a call out for a stall (0.25 s),
then a readiness check's 1 s."""


@pytest.fixture
def silent(tmp_path: Path) -> Iterator[tuple[netns.Netns, Service]]:
    """The branch's only replica, in a network namespace of its own."""
    with isolated_predictor(tmp_path) as (ns, service):
        yield ns, service


def _branch_answers(url: str) -> bool:
    answer = httpx.post(
        f"{url}/v1/pipelines/digits-partial/infer",
        content=BODY,
        headers={"Content-Type": "image/png"},
        timeout=10,
    ).json()
    return any(s["name"] == "ensemble/mlp" and s["status"] == "ok" for s in answer["steps"])


@pytest.mark.parametrize("fault", ["blackhole", "sigstop"])
def test_a_silent_branch_costs_a_partial_pipeline_nothing_once_noticed(
    mesh: Mesh, silent: tuple[netns.Netns, Service], fault: str
) -> None:
    ns, service = silent
    address = f"{ns.address}:{service.port}"
    start_fault, heal = FAULTS[fault]
    rows: dict[str, int] = {}

    def healed() -> None:
        heal(ns, service)
        rows["healed"] = _rows(address)

    with mesh.extra_proxy(27590, **{VARIABLE: address}) as url:
        tally = load_with_events(
            url,
            "/v1/pipelines/digits-partial/infer",
            BODY,
            HEALTHY_S + FAULT_S + AFTER_S,
            [(HEALTHY_S, lambda: start_fault(ns, service)), (HEALTHY_S + FAULT_S, healed)],
            after=lambda: heal(ns, service),
        )
        refused = metric_of(url, "proxy_calls_refused_total", endpoint=address)
        give_up = time.monotonic() + 10
        while not _branch_answers(url):
            assert time.monotonic() < give_up, "the branch was not called again after it healed"
            time.sleep(0.2)
        rows["after"] = _rows(address)
    done = [
        (start + latency, status)
        for (start, status), latency in zip(tally.timeline, tally.latencies, strict=True)
    ]

    def answered(start: float, end: float) -> int:
        return sum(1 for t, s in done if start <= t < end and s == 200)

    healthy = answered(1.0, HEALTHY_S) / (HEALTHY_S - 1.0) * WINDOW_S
    noticed = HEALTHY_S + NOTICED_S
    windows = [answered(t, t + WINDOW_S) for t in range(int(noticed), int(HEALTHY_S + FAULT_S), 2)]
    report(
        f"the only replica of a branch {fault} for {FAULT_S:.0f} s, digits-partial under 8 "
        f"clients: healthy {healthy / WINDOW_S:.0f} req/s, per {WINDOW_S:.0f} s once noticed "
        f"{[round(w / WINDOW_S) for w in windows]} req/s; {refused:.0f} calls refused; "
        f"{json.dumps(dict(tally.by_status))}; slowest {max(tally.latencies):.2f} s"
    )
    assert tally.lost == 0 and tally.hung == 0
    assert set(tally.by_status) == {200}, tally.bodies
    assert refused > 0
    assert min(windows) >= 0.5 * healthy, (healthy, windows)
    # The calls out when it went silent were let go once it was noticed (~1.3 s): none of
    # their requests waited out its 3 s budget (before, one per client did).
    assert max(tally.latencies) < 2.9, max(tally.latencies)
    assert rows["after"] > rows["healed"], "the replica was not used again after it healed"
