"""Client-side balancing for real: two replicas of a predictor, on 127.0.0.1 and 127.0.0.2,
named by one endpoint variable (`ipv4:a:port,b:port`, as a Kubernetes headless Service's
`dns:///` name resolves to its pods): the proxy's calls spread over both and keep
succeeding when one is killed."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from protos import pb, pb_grpc
from tests.e2e.conftest import Mesh
from tests.e2e.test_digits import held_out, png
from tests.procs import ROOT, Service, established_on_port, start_service
from tests.report import report

MODEL = "digits_logreg"
VARIABLE = "PREDICTOR_DIGITS_LOGREG_URL"


def _replica(host: str, workdir: Path, env: dict[str, str] | None = None) -> Service:
    repository = str(ROOT / "models" / "repository")
    args = ["--repository", repository, "--models", MODEL, "--host", host]
    return start_service("predictors", args, workdir, env=env)


def _two_replicas(workdir: Path) -> Iterator[dict[str, Service]]:
    started = {host: _replica(host, workdir) for host in ("127.0.0.1", "127.0.0.2")}
    yield started
    for service in started.values():
        service.stop()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[dict[str, Service]]:
    """Two of their own (a test that kills one)."""
    yield from _two_replicas(tmp_path)


@pytest.fixture(scope="module")
def shared_replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Service]]:
    """Two for the tests that only call them (starting two each took ~5 s of the suite)."""
    yield from _two_replicas(tmp_path_factory.mktemp("replicas"))


def _target(replicas: dict[str, Service]) -> str:
    return "ipv4:" + ",".join(f"{host}:{s.port}" for host, s in replicas.items())


def _rows_served(host: str, service: Service) -> int:
    with grpc.insecure_channel(f"{host}:{service.port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name=MODEL), timeout=10)
    return sum(s.inference_count for s in stats.model_stats)


def _load(
    url: str, blobs: list[bytes], clients: int, seconds: float, failures: list[str] | None = None
) -> list[int]:
    """Closed-loop load; every answer's status (the bodies of those not 200 to `failures`)."""
    statuses: list[int] = []
    end = time.monotonic() + seconds

    def worker(offset: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            i = offset
            while time.monotonic() < end:
                r = client.post(
                    "/v1/pipelines/digits/infer",
                    content=blobs[i % len(blobs)],
                    headers={"Content-Type": "image/png"},
                )
                statuses.append(r.status_code)
                if r.status_code != 200 and failures is not None:
                    failures.append(r.text[:300])
                i += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


@pytest.mark.parametrize(
    ("port", "env"),
    [
        (27095, {"PROXY_BALANCE": "proxy"}),  # streams, merged calls: the default path
        (27096, {"PROXY_BALANCE": "proxy", "PROXY_TRANSPORT": "unary"}),
        (27097, {"PROXY_BALANCE": "grpc", "PROXY_TRANSPORT": "unary"}),
    ],
    ids=["proxy-streams", "proxy-unary", "grpc-round-robin-unary"],
)
def test_calls_spread_over_the_replicas(
    mesh: Mesh, shared_replicas: dict[str, Service], port: int, env: dict[str, str]
) -> None:
    replicas = shared_replicas
    blobs = [png(image) for image in held_out()[0][:20]]
    before = [_rows_served(host, s) for host, s in replicas.items()]
    with mesh.extra_proxy(port, **{VARIABLE: _target(replicas)}, **env) as url:
        sequential = _load(url, blobs, clients=1, seconds=1.5)
        concurrent = _load(url, blobs, clients=6, seconds=2.0)
    assert set(sequential + concurrent) == {200}
    after = [_rows_served(host, s) for host, s in replicas.items()]
    served = [a - b for a, b in zip(after, before, strict=True)]
    total = sum(served)
    assert total >= len(sequential) + len(concurrent)  # readiness checks add none
    assert min(served) >= 0.25 * total, f"rows per replica: {served}"


def test_calls_keep_succeeding_when_a_replica_is_killed(
    mesh: Mesh, replicas: dict[str, Service]
) -> None:
    blobs = [png(image) for image in held_out()[0][:20]]
    doomed = replicas["127.0.0.2"]
    with mesh.extra_proxy(27098, **{VARIABLE: _target(replicas)}) as url:
        served_before: list[int] = []

        def kill_once_it_served_its_share() -> None:
            # Mid-load, once it has answered some of it (not at a fixed time: how much a
            # second holds depends on what else the machine runs).
            until = time.monotonic() + 2.0
            while (served := _rows_served("127.0.0.2", doomed)) <= 20:
                if time.monotonic() > until:
                    break
                time.sleep(0.05)
            served_before.append(served)
            doomed.stop(sig=signal.SIGKILL)

        killer = threading.Thread(target=kill_once_it_served_its_share)
        killer.start()
        failures: list[str] = []
        statuses = _load(url, blobs, clients=6, seconds=3.0, failures=failures)
        killer.join()
        after = _load(url, blobs, clients=2, seconds=1.0)
    assert doomed.proc.returncode == -signal.SIGKILL
    assert served_before and served_before[0] > 20  # it had its share until it died
    assert len(statuses) > 50
    assert set(statuses) == {200}, failures[-3:]
    assert set(after) == {200}
    survivor = replicas["127.0.0.1"]
    assert _rows_served("127.0.0.1", survivor) >= len(after)
    report(
        f"balancing: a replica SIGKILLed under 6 clients: {len(statuses)} requests, "
        f"all 200 (it had served {served_before[0]} rows)"
    )


@pytest.mark.parametrize("age", [None, 0.5])
def test_max_connection_age_sends_callers_to_reconnect(tmp_path: Path, age: float | None) -> None:
    """Behind a ClusterIP Service (KServe's predictors) only a new connection can reach
    another replica: PREDICTOR_MAX_CONNECTION_AGE_S closes each one after that long."""
    env = {} if age is None else {"PREDICTOR_MAX_CONNECTION_AGE_S": str(age)}
    service = _replica("127.0.0.1", tmp_path, env)
    ready, idle = grpc.ChannelConnectivity.READY.value[0], grpc.ChannelConnectivity.IDLE.value[0]
    try:
        with grpc.insecure_channel(service.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
            # Three ages on; then, with an age, until the GOAWAY came (a loaded machine may
            # run the server's timer late: a full suite once saw READY at 1.5 s).
            time.sleep(1.5)
            state = channel._channel.check_connectivity_state(False)
            deadline = time.monotonic() + 15
            while age is not None and state != idle and time.monotonic() < deadline:
                time.sleep(0.1)
                state = channel._channel.check_connectivity_state(False)
            assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
    finally:
        service.stop()
    assert state == (ready if age is None else idle)


@pytest.mark.parametrize(("port", "connections"), [(27099, 1), (27100, 3)])
def test_connections_per_endpoint_open_separate_connections(
    mesh: Mesh, tmp_path: Path, port: int, connections: int
) -> None:
    """Behind a Service that balances connections, only separate connections can reach
    separate replicas: PROXY_CONNECTIONS_PER_ENDPOINT opens that many to one address."""
    replica = _replica("127.0.0.1", tmp_path)
    env = {VARIABLE: replica.address, "PROXY_CONNECTIONS_PER_ENDPOINT": str(connections)}
    blobs = [png(image) for image in held_out()[0][:20]]
    try:
        with mesh.extra_proxy(port, **env) as url:
            statuses = _load(url, blobs, clients=4, seconds=1.0)
            held = established_on_port(replica.proc.pid, replica.port)
    finally:
        replica.stop()
    assert set(statuses) == {200}
    assert held == connections
