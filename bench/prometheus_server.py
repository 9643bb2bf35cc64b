"""A real Prometheus (Debian's `prometheus`) as a local process on 127.0.0.1, for the tests:
a free port, its data in a temporary folder, scraping the given targets every second and
evaluating the given rule files; queried over its HTTP API."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from bench.mesh import free_port
from compose.processes import stop_process


class Unavailable(RuntimeError):
    """No prometheus here (`./mesh test` installs Debian's when run as root)."""


def available() -> bool:
    return shutil.which("prometheus") is not None


@dataclass
class PrometheusServer:
    process: subprocess.Popen
    port: int
    folder: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> list[dict]:
        """An instant query's series (raises on a PromQL error)."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        if body.get("status") != "success":
            raise ValueError(f"{expr}: {body.get('error', answer.text)}")
        return body["data"]["result"]

    def rules(self) -> list[dict]:
        answer = httpx.get(f"{self.url}/api/v1/rules", timeout=10).json()
        return [rule for group in answer["data"]["groups"] for rule in group["rules"]]

    def targets(self) -> list[dict]:
        return httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]

    def stop(self) -> None:
        stop_process(self.process, timeout=20)
        shutil.rmtree(self.folder, ignore_errors=True)


def start(jobs: Mapping[str, Sequence[str]], rule_files: Sequence[Path] = ()) -> PrometheusServer:
    """Scraping each job's `host:port` targets (their /metrics) every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise Unavailable("prometheus is missing (apt-get install prometheus)")
    folder = Path(tempfile.mkdtemp(prefix="mesh-prometheus-"))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(targets)}]}
            for job, targets in jobs.items()
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with (folder / "prometheus.log").open("wb") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [binary, f"--config.file={folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT, cwd=folder,
        )  # fmt: skip
    server = PrometheusServer(process, port, folder)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = (folder / "prometheus.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"prometheus exited with {process.returncode}: {text}")
        try:
            if httpx.get(f"{server.url}/-/ready", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError("prometheus did not become ready in 30 s")
