"""The README's run command: `python -m compose.local` brings the mesh up and down cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx

from samples.images import encode, render_digit
from tests.procs import ROOT

# Ports 30002..31113: below the ephemeral range (32768+), where a client connection may
# already hold the port, and clear of the session mesh (+20000).
OFFSET = 22000


def test_local_runner_serves_and_stops_on_sigterm(tmp_path) -> None:
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "compose.local", "--port-offset", str(OFFSET)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        while "Ctrl-C stops every service" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "mesh not up in 180 s"
            time.sleep(0.5)
        url = f"http://127.0.0.1:{8080 + OFFSET}"
        assert f"proxy: {url}" in log.read_text()
        digit = encode(render_digit(__import__("numpy").eye(8) * 16))
        r = httpx.post(
            f"{url}/v1/pipelines/digits/infer",
            content=digit,
            headers={"Content-Type": "image/png"},
            timeout=30,
        )
        assert r.status_code == 200 and isinstance(r.json()["result"]["label"], int)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, log.read_text()[-3000:]
    text = log.read_text()
    # 7 services and the proxy's gRPC door.
    assert text.count('"msg": "stopped"') == 8, "every gRPC server stopped gracefully"
