"""A real Redis (Debian's `redis-server`) as a local process on 127.0.0.1, for the tests and
the benchmarks: a free port; memory bounded with LRU eviction and no persistence (what a
cache deployment sets), or, `persistent`, as the jobs' queue needs it: an append-only file
and eviction of keys with a TTL only (volatile-lru)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.mesh import free_port


class Unavailable(RuntimeError):
    """No redis-server here (`./mesh test` installs Debian's when run as root)."""


@dataclass
class RedisServer:
    process: subprocess.Popen
    port: int
    args: list[str]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def restart(self) -> None:
        """Stopped (SIGTERM: what it holds is written out) and started again, same port and
        files."""
        self.stop()
        self.process = _launch(self.args, self.port)


def available() -> bool:
    return shutil.which("redis-server") is not None


def start(
    workdir: Path, max_mb: int = 256, port: int | None = None, persistent: bool = False
) -> RedisServer:
    binary = shutil.which("redis-server")
    if binary is None:
        raise Unavailable("redis-server is missing (apt-get install redis-server)")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    durability = (
        ("--save", "", "--appendonly", "yes", "--appendfsync", "everysec")
        if persistent
        else ("--save", "", "--appendonly", "no")
    )
    policy = "volatile-lru" if persistent else "allkeys-lru"
    args = [
        binary,
        *("--bind", "127.0.0.1", "--port", str(port), "--dir", str(workdir)),
        *durability,
        "--protected-mode",
        "yes",
        *("--maxmemory", f"{max_mb}mb", "--maxmemory-policy", policy),
    ]
    return RedisServer(_launch(args, port), port, args)


def _launch(args: list[str], port: int) -> subprocess.Popen:
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("redis-server did not answer within 10 s")
