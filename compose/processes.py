"""Start one service (`python -m <module>`) as a process on port 0 and wait until it is
ready (it writes its ports to a file once its models are loaded). Used by the tests and
the benchmarks; `compose.local` runs a whole topology instead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

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
        return stop_process(self.proc, sig, timeout)


def stop_process(
    proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30.0
) -> int | None:
    """Signal `proc` (if it still runs) and wait for it; SIGKILL if it outlives `timeout`.
    Every process the tests and benchmarks start is stopped so: services, Redis' and
    PostgreSQL's, Prometheus, the foreign v2 servers, dockerd."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def start_service(
    module: str,
    args: list[str],
    workdir: Path,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 90.0,
    prefix: tuple[str, ...] = (),
) -> Service:
    """Run `python -m module args` with port 0 and wait for its port file (= ready);
    `prefix` goes before the command (e.g. `ip netns exec NAME`, which execs it: the
    process is still the service's own)."""
    tag = f"{module}-{uuid.uuid4().hex[:8]}"
    port_file = workdir / f"{tag}.port.json"
    log_path = workdir / f"{tag}.log"
    cmd = [
        *prefix,
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


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process `pid` holds (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def tcp_sockets() -> list[list[str]]:
    """Every TCP socket of this network namespace, as the fields of /proc/net/tcp{,6} (IPv4
    and IPv4-mapped: gRPC listens on an IPv6 socket)."""
    return [
        line.split()
        for table in ("/proc/net/tcp", "/proc/net/tcp6")
        for line in Path(table).read_text().splitlines()[1:]
    ]
