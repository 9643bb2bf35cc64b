"""What a hostile request cost: a process's CPU and memory (from /proc), the time to an
answer, and raw HTTP where a client library would refuse to be rude."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def memory_mb(pid: int) -> tuple[float, float]:
    """(resident now, peak resident since start), MiB."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, kb, _ = line.split()
                values[key] = int(kb) / 1024
    return values["VmRSS:"], values["VmHWM:"]


@dataclass
class Cost:
    cpu_s: float
    peak_growth_mb: float
    """How far the process's peak resident memory rose."""
    seconds: float


class Watch:
    """CPU, peak memory growth and wall time of some processes over a block."""

    def __init__(self, *pids: int) -> None:
        self.pids = pids

    def __enter__(self) -> Watch:
        self.start = time.monotonic()
        self.cpu = [cpu_seconds(p) for p in self.pids]
        self.peak = [memory_mb(p)[1] for p in self.pids]
        return self

    def __exit__(self, *exc: object) -> None:
        self.cost = Cost(
            sum(cpu_seconds(p) - c for p, c in zip(self.pids, self.cpu, strict=True)),
            max(memory_mb(p)[1] - m for p, m in zip(self.pids, self.peak, strict=True)),
            time.monotonic() - self.start,
        )


def exchange(
    port: int, parts: list[bytes], *, pause: float = 0.0, timeout: float = 30.0
) -> tuple[int | None, bytes, float]:
    """Send `parts` (pausing between them), read the answer: (status, raw answer, seconds).
    A server that answers and closes while we are still sending is fine: its answer is
    read all the same."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            for i, part in enumerate(parts):
                if i and pause:
                    time.sleep(pause)
                # Stop sending once the server has answered (it may have closed: what we
                # would still send would only reset the connection under its answer).
                if select.select([sock], [], [], 0)[0]:
                    break
                sock.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or len(answer) < _framed_length(answer):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None
    return status, answer, time.monotonic() - start


def _framed_length(answer: bytes) -> int:
    head, _, _ = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return len(answer) + 1


def health_meanwhile(url: str, stop: threading.Event, seconds: list[float]) -> None:
    """GET /healthz until `stop` is set, each answer's time to `seconds` (in a thread)."""
    with httpx.Client(base_url=url, timeout=10) as client:
        while not stop.is_set():
            start = time.monotonic()
            client.get("/healthz")
            seconds.append(time.monotonic() - start)
            time.sleep(0.02)


@contextmanager
def health_watched(url: str) -> Iterator[list[float]]:
    """/healthz polled in a thread from before the block (its first answer is awaited: a
    refusal can come quicker than a thread's first request) until 0.1 s after it; yields
    each answer's time."""
    stop, seconds = threading.Event(), []
    checker = threading.Thread(target=health_meanwhile, args=(url, stop, seconds))
    checker.start()
    try:
        until = time.monotonic() + 30
        while not seconds:
            assert checker.is_alive() and time.monotonic() < until, "/healthz never answered"
            time.sleep(0.01)
        yield seconds
        time.sleep(0.1)
    finally:
        stop.set()
        checker.join()
