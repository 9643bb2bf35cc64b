"""Helpers of the tests around real service processes on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys

from bench.services import metric_of as metric_of  # one reader for tests and benches
from compose.processes import ROOT, Service, socket_inodes, start_service, tcp_sockets


def metric(metrics_port: int | str, sample: str, **labels: str) -> float:
    """Sum of a Prometheus sample (e.g. `v2_requests_total`) over the series whose labels
    include `labels`, scraped from a service's /metrics port."""
    return metric_of(f"http://127.0.0.1:{metrics_port}", sample, **labels)


LISTEN, ESTABLISHED = "0A", "01"


def established_on_port(pid: int, port: int, state: str = ESTABLISHED) -> int:
    """Connections accepted on `port` that process `pid` holds (from /proc, no psutil);
    `state=LISTEN`: its listening sockets on the port."""
    inodes = socket_inodes(pid)
    return sum(
        1
        for fields in tcp_sockets()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == state and fields[9] in inodes
    )


def run_module(module: str, args: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run a module to completion (for start-up failures)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


__all__ = [
    "LISTEN",
    "ROOT",
    "Service",
    "established_on_port",
    "metric",
    "metric_of",
    "run_module",
    "start_service",
]
