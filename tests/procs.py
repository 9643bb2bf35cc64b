"""Start the mesh's services as real processes on 127.0.0.1 for tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int | None
    log_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the process and wait for it; SIGKILL if it outlives the timeout."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_service(
    module: str,
    args: list[str],
    workdir: Path,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 90.0,
) -> Service:
    """Run `python -m module args` with port 0 and wait for its port file (= ready)."""
    tag = f"{module}-{uuid.uuid4().hex[:8]}"
    port_file = workdir / f"{tag}.port.json"
    log_path = workdir / f"{tag}.log"
    cmd = [
        sys.executable,
        "-m",
        module,
        *args,
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--port-file",
        str(port_file),
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    end = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{module} exited with {proc.returncode}:\n{log_path.read_text()}")
        if time.monotonic() > end:
            proc.kill()
            raise TimeoutError(f"{module} not ready in {timeout}s:\n{log_path.read_text()}")
        time.sleep(0.05)
    ports = json.loads(port_file.read_text())
    return Service(proc, ports["grpc"], ports["metrics"], log_path)


def metric(metrics_port: int | str, sample: str, **labels: str) -> float:
    """Sum of a Prometheus sample (e.g. `v2_requests_total`) over the series whose labels
    include `labels`, scraped from a service's /metrics port."""
    return metric_of(f"http://127.0.0.1:{metrics_port}", sample, **labels)


def metric_of(base_url: str, sample: str, **labels: str) -> float:
    """The same, from `<base_url>/metrics` (e.g. the proxy's)."""
    text = urllib.request.urlopen(f"{base_url}/metrics", timeout=10).read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample and labels.items() <= s.labels.items()
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


__all__ = ["Service", "metric", "metric_of", "run_module", "start_service"]
