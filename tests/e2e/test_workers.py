"""PROXY_WORKERS: several proxy processes on one port, one view of their metrics, a dead
worker replaced, a graceful stop of all."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from proxy.doors import grpc_front_nginx as nginx
from proxy.doors.grpc_front_nginx import front_pids
from proxy.settings import ProxySettings
from tests.e2e.conftest import Mesh
from tests.e2e.test_digits import held_out, png
from tests.e2e.test_v2_door import probe
from tests.procs import LISTEN, ROOT, established_on_port, metric_of

PORT = 27090
GRPC_PORT = 27091
DOOR_PORT = 27092
"""The grpc.aio door's, behind the front (nginx on GRPC_PORT) where nginx is installed."""
URL = f"http://127.0.0.1:{PORT}"


def _children(pid: int) -> list[int]:
    """The supervisor's workers (its nginx, the gRPC door's front, left out)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return sorted(set(found) - set(front_pids(pid)))


def _spread(port: int, workers: list[int]) -> list[int]:
    """How 16 new connections to `port` fall on each worker, once all are accepted (a
    worker whose start-up is still finishing holds its share in the listen backlog)."""
    deadline = time.monotonic() + 30
    # /readyz answered by one worker says nothing of the other: wait until both listen.
    while not all(established_on_port(pid, port, LISTEN) for pid in workers):
        assert time.monotonic() < deadline, f"not every worker listens on {port}"
        time.sleep(0.1)
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]
    deadline = time.monotonic() + 10
    while True:
        time.sleep(0.2)
        spread = [established_on_port(pid, port) for pid in workers]
        if sum(spread) == 16 or time.monotonic() > deadline:
            break
    for sock in held:
        sock.close()
    return spread


def _wait_ready(proc: subprocess.Popen, workers: int) -> None:
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, "the supervisor exited"
        assert time.monotonic() < deadline, "workers not ready"
        try:
            ready = httpx.get(URL + "/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            ready = False
        if ready and len(_children(proc.pid)) == workers:
            return
        time.sleep(0.2)


def _digits(n: int) -> list[int]:
    images, _ = held_out()
    statuses = []
    for i in range(n):
        # A connection each: the kernel picks a worker per connection.
        r = httpx.post(
            f"{URL}/v1/pipelines/digits/infer",
            content=png(images[i % len(images)]),
            headers={"Content-Type": "image/png"},
            timeout=30,
        )
        statuses.append(r.status_code)
    return statuses


def test_workers_share_the_port_metrics_and_a_graceful_stop(mesh: Mesh, tmp_path: Path) -> None:
    env = {
        **os.environ,
        **mesh.local.services["proxy"].env,
        "PROXY_PORT": str(PORT),
        "PROXY_GRPC_PORT": str(GRPC_PORT),
        "PROXY_GRPC_DOOR_PORT": str(DOOR_PORT),
        "PROXY_WORKERS": "2",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "proxy"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_ready(supervisor, 2)
        workers = _children(supervisor.pid)
        fronts = front_pids(supervisor.pid)  # one front, the supervisor's, for all workers
        assert len(fronts) == (2 if nginx.binary(ProxySettings()) else 0), fronts

        # Connections are spread over both workers (16 of them all on one: 1 in 32,768),
        # on the REST port and on the gRPC door's (behind the front: the port it calls).
        for port in (PORT, DOOR_PORT if fronts else GRPC_PORT):
            spread = _spread(port, workers)
            assert sum(spread) == 16 and min(spread) > 0, (port, spread)

        # Every worker's /metrics counts every worker's requests.
        assert _digits(30) == [200] * 30
        counts = {metric_of(URL, "proxy_requests_total", pipeline="digits", status="200")}
        for _ in range(9):
            counts.add(metric_of(URL, "proxy_requests_total", pipeline="digits", status="200"))
        assert counts == {30.0}, counts

        # ... and the gRPC door's answers are /v1's.
        images, _ = held_out()
        blobs = [png(images[i]) for i in range(4)]
        seen = probe(f"127.0.0.1:{GRPC_PORT}", "digits", blobs, tmp_path)
        labels = [
            httpx.post(
                f"{URL}/v1/pipelines/digits/infer", content=b, headers={"Content-Type": "image/png"}
            ).json()["result"]["label"]
            for b in blobs
        ]
        assert [u["label"]["data"][0] for u in seen["unary"]] == labels

        # A worker that dies is replaced; requests go on.
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while set(_children(supervisor.pid)) & {workers[0]} or len(_children(supervisor.pid)) < 2:
            assert time.monotonic() < deadline, "the dead worker was not replaced"
            time.sleep(0.2)
        _wait_ready(supervisor, 2)
        assert _digits(10) == [200] * 10
    finally:
        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(60)
    assert code == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers[1:] + fronts)
