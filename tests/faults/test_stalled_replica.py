"""One of two replicas of a predictor stops answering under load, as a node does that
vanished (its packets dropped inside its own network namespace), a frozen process (SIGSTOP),
or a host that refuses (TCP resets): the pipeline keeps at least half its healthy throughput
in every 2 s of the fault, at most 1% of requests fail, and the replica is used again once
it heals. Before proxy/transport/hedging.py and a 1 s keepalive, a blackholed replica of two took
`digits` from ~540 to ~3 requests/s for ~18 s."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest

from protos import pb, pb_grpc
from samples.images import encode, render_digit
from tests.conftest import Mesh
from tests.faults import netns
from tests.faults.load import Tally, load_with_events
from tests.procs import ROOT, Service, metric_of, start_service
from tests.report import report

pytestmark = pytest.mark.alone  # how the mesh holds under load: no other test beside it

BODY = encode(render_digit(np.eye(8) * 16))
MODEL, VARIABLE = "digits_mlp", "PREDICTOR_DIGITS_MLP_URL"
HEALTHY_S, FAULT_S, SHORT_FAULT_S, AFTER_S = 3.0, 20.0, 10.0, 4.0
"""On the default path the fault lasts 20 s, as issue 24 asks: longer than the ~18 s a
blackholed replica used to stop the step for (at ~3 requests/s, failing every window) and
than the 2 s keepalive takes to close a dead connection. The old path's blackhole lasts
10 s, which already holds five windows after the keepalive's."""
WINDOW_S = 2.0


@contextmanager
def isolated_predictor(tmp_path: Path) -> Iterator[tuple[netns.Netns, Service]]:
    """A `digits_mlp` replica in a network namespace of its own (thawed, then stopped on
    exit); CI must be able to make one."""
    if not netns.available():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the network fault tests: they need {netns.NEEDS}")
        pytest.skip(f"needs {netns.NEEDS}")
    args = ["--repository", str(ROOT / "models" / "repository"), "--models", MODEL]
    with netns.namespace(1) as ns:
        service = start_service(
            "predictors", [*args, "--host", ns.address], tmp_path, prefix=ns.prefix
        )
        try:
            yield ns, service
        finally:
            service.proc.send_signal(signal.SIGCONT)
            service.stop()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[netns.Netns, Service, Service]]:
    """Replica A in a network namespace of its own, replica B beside the tests."""
    with isolated_predictor(tmp_path) as (ns, isolated):
        args = ["--repository", str(ROOT / "models" / "repository"), "--models", MODEL]
        beside = start_service("predictors", [*args, "--host", "127.0.0.1"], tmp_path)
        try:
            yield ns, isolated, beside
        finally:
            beside.stop()


def _rows(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name=MODEL), timeout=5)
    return sum(s.inference_count for s in stats.model_stats)


def _windows(tally: Tally, fault_s: float) -> tuple[float, float, list[int], int, int]:
    """(healthy answers per window before the fault, and after it healed; answers per window
    of the fault; requests sent during the fault and just after, of which failed)."""
    done = [
        (start + latency, status)
        for (start, status), latency in zip(tally.timeline, tally.latencies, strict=True)
    ]

    def rate(start: float, end: float) -> float:
        answered = sum(1 for t, s in done if start <= t < end and s == 200)
        return answered / (end - start) * WINDOW_S

    healed = HEALTHY_S + fault_s
    before, after = rate(1.0, HEALTHY_S), rate(healed + 1.0, healed + AFTER_S)
    edges = np.arange(HEALTHY_S, HEALTHY_S + fault_s, WINDOW_S)
    windows = [sum(1 for t, s in done if e <= t < e + WINDOW_S and s == 200) for e in edges]
    during = [s for start, s in tally.timeline if start >= HEALTHY_S]
    return before, after, windows, len(during), sum(1 for s in during if s != 200)


FAULTS: dict[str, tuple[Callable[[netns.Netns, Service], None], Callable]] = {
    "blackhole": (lambda ns, svc: ns.blackhole(), lambda ns, svc: ns.heal()),
    "sigstop": (
        lambda ns, svc: svc.proc.send_signal(signal.SIGSTOP),
        lambda ns, svc: svc.proc.send_signal(signal.SIGCONT),
    ),
    "refused": (lambda ns, svc: ns.refuse(), lambda ns, svc: ns.heal()),
}


@pytest.mark.parametrize(
    ("fault", "env", "fault_s"),
    [
        ("blackhole", {}, FAULT_S),
        ("blackhole", {"PROXY_TRANSPORT": "unary", "PROXY_MERGE": "false"}, SHORT_FAULT_S),
        ("sigstop", {}, FAULT_S),
        # Resets are seen at once (the connection fails, the balancer passes the replica
        # over): two windows show it.
        ("refused", {}, 2 * WINDOW_S),
    ],
    ids=["blackhole-streams", "blackhole-unary", "sigstop-streams", "refused-streams"],
)
def test_one_replica_stops_answering(
    mesh: Mesh,
    replicas: tuple[netns.Netns, Service, Service],
    fault: str,
    env: dict[str, str],
    fault_s: float,
) -> None:
    ns, isolated, beside = replicas
    target = f"ipv4:{ns.address}:{isolated.port},127.0.0.1:{beside.port}"
    isolated_address = f"{ns.address}:{isolated.port}"
    start_fault, heal = FAULTS[fault]
    rows: dict[str, int] = {}

    def healed() -> None:
        heal(ns, isolated)
        rows["healed"] = _rows(isolated_address)

    with mesh.extra_proxy(27580, **{VARIABLE: target}, **env) as url:
        tally = load_with_events(
            url,
            "/v1/pipelines/digits/infer",
            BODY,
            HEALTHY_S + fault_s + AFTER_S,
            [
                (HEALTHY_S - 0.5, lambda: rows.update(before=_rows(isolated_address))),
                (HEALTHY_S, lambda: start_fault(ns, isolated)),
                (HEALTHY_S + fault_s, healed),
            ],
            after=lambda: heal(ns, isolated),
        )
        rows["after"] = _rows(isolated_address)
        passed_over = metric_of(url, "proxy_replicas_passed_over_total", endpoint=target)
        hedged = metric_of(url, "proxy_hedged_calls_total", endpoint=target)
    before, after, windows, during, failed = _windows(tally, fault_s)
    name = f"{fault}{' (unary)' if env else ''}"
    report(
        f"one of two replicas {name} for {fault_s:.0f} s under 8 clients: healthy "
        f"{before / WINDOW_S:.0f} req/s (after it healed {after / WINDOW_S:.0f}), during the "
        f"fault per {WINDOW_S:.0f} s {[round(w / WINDOW_S) for w in windows]} req/s, "
        f"{failed} of {during} failed; replica passed over {passed_over:.0f} times, "
        f"{hedged:.0f} calls hedged"
    )
    assert tally.lost == 0 and tally.hung == 0
    assert rows["before"] > 0, "the isolated replica had its share before the fault"
    # Healthy is both replicas answering, before the fault and after it healed: the lower of
    # the two, because this machine's own speed drifts by a fifth within half a minute (a CI
    # run read 380 req/s healthy, then windows falling steadily from 377 to 182 while the
    # same test alone held 300-350 in every window, three runs of three).
    healthy = min(before, after)
    assert min(windows) >= 0.5 * healthy, (before, after, windows)
    assert failed <= 0.01 * during, tally.by_status
    assert rows["after"] > rows["healed"], "the replica was not used again after it healed"
    # What an operator sees of it: the replica passed over, and where it stalled rather
    # than refused, the calls it held sent to the other replica as well.
    assert passed_over >= 1
    assert hedged >= 1 or fault == "refused"
