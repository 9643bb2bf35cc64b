"""The README's run command: `python -m compose.local` brings the mesh up and down cleanly,
with the shipped Redis as its jobs' queue where Debian's redis-server is installed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench import redis_server
from samples import text
from samples.images import encode, render_digit
from tests import offsets
from tests.procs import ROOT

OFFSET = offsets.RUN_COMMAND


def _job(url: str, digit: bytes) -> dict:
    r = httpx.post(
        f"{url}/v1/pipelines/digits/jobs",
        content=digit,
        headers={"Content-Type": "image/png"},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while True:
        job = httpx.get(f"{url}{r.headers['Location']}", timeout=10).json()
        if job["status"] not in ("queued", "running"):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


def _page() -> text.Sample:
    """A long receipt: seconds of OCR here, in flight when the mesh is told to stop."""
    return text.receipt(seed=3, lines=120)


def _ocr(url: str, image: bytes) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/pipelines/ocr/infer",
        content=image,
        headers={"Content-Type": "image/png", "X-Request-Timeout-Ms": "30000"},
        timeout=60,
    )


def _why_down(text: str) -> str:
    """The lines of the service whose exit brought the mesh down (the tail of the log is
    mostly the others shutting down), then that tail."""
    match = re.search(r"service '([\w-]+)' exited", text)
    own = [line for line in text.splitlines() if match and line.startswith(match.group(1) + " ")]
    return "\n".join(own[-40:]) + "\n...\n" + text[-1500:]


def test_local_runner_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    if not redis_server.available():
        if os.environ.get("CI"):
            pytest.fail("CI must run the shipped Redis: redis-server is missing")
        pytest.skip("redis-server is missing (./mesh test installs it when run as root)")
    log = tmp_path / "up.log"
    # The shipped settings, not the suite's (its proxies keep jobs in SQLite files).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROXY_")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "compose.local",
                "--port-offset",
                str(OFFSET),
                "--data",
                str(tmp_path / "data"),
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        while "Ctrl-C stops every service" not in log.read_text():
            assert proc.poll() is None, _why_down(log.read_text())
            assert time.monotonic() < deadline, "mesh not up in 180 s"
            time.sleep(0.5)
        url = f"http://127.0.0.1:{8080 + OFFSET}"
        assert f"proxy: {url}" in log.read_text()
        digit = encode(render_digit(np.eye(8) * 16))
        r = httpx.post(
            f"{url}/v1/pipelines/digits/infer",
            content=digit,
            headers={"Content-Type": "image/png"},
            timeout=30,
        )
        assert r.status_code == 200 and isinstance(r.json()["result"]["label"], int)
        # Jobs go to the topology's redis-server, its append-only file in the named volume.
        ready = httpx.get(f"{url}/readyz", timeout=10).json()["endpoints"]
        assert ready["PROXY_JOBS_URL/jobs"]["address"] == f"redis://127.0.0.1:{6380 + OFFSET}/0"
        job = _job(url, digit)
        assert job["status"] == "succeeded", job
        assert job["result"]["result"] == r.json()["result"]
        assert list((tmp_path / "data" / "redis-data").glob("appendonlydir/*.aof"))
        # Stopped under a request in flight: the proxy finishes it through services that
        # still answer (stopped all at once, its next step met a service draining: 503).
        with ThreadPoolExecutor(1) as pool:
            page = _page()
            reading = pool.submit(_ocr, url, page.image)
            time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            answer = reading.result(timeout=60)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["result"]["lines"]) >= len(page.lines) // 2, answer.text
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, log.read_text()[-3000:]
    text = log.read_text()
    # 7 services of ours and the proxy's gRPC door.
    assert text.count('"msg": "stopped"') == 8, "every gRPC server stopped gracefully"
