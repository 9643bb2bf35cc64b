"""Closed-loop load: N workers, each sending its next request when the last one returns."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stats:
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def _stats(latencies: list[float], errors: int, seconds: float) -> Stats:
    lat = np.array(latencies) * 1000 if latencies else np.array([np.nan])
    return Stats(
        len(latencies),
        errors,
        seconds,
        float(np.percentile(lat, 50)),
        float(np.percentile(lat, 99)),
    )


async def run_async(
    call: Callable[[], Awaitable[object]],
    concurrency: int,
    duration_s: float,
    warmup_s: float = 0.5,
) -> Stats:
    """Drive an async call; only calls that start after the warm-up are measured."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s
    latencies: list[float] = []
    errors = 0

    async def worker() -> None:
        nonlocal errors
        while (t0 := loop.time()) < stop_at:
            try:
                await call()
                ok = True
            except Exception:
                ok = False
            if t0 >= measure_from:
                if ok:
                    latencies.append(loop.time() - t0)
                else:
                    errors += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return _stats(latencies, errors, duration_s)


def run_threads(
    call: Callable[[], object], concurrency: int, duration_s: float, warmup_s: float = 0.5
) -> Stats:
    """Drive a blocking call from `concurrency` threads (the in-process baseline)."""
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s
    per_thread: list[list[float]] = [[] for _ in range(concurrency)]

    def worker(out: list[float]) -> None:
        while (t0 := time.perf_counter()) < stop_at:
            call()
            if t0 >= measure_from:
                out.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker, args=(o,)) for o in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _stats([x for o in per_thread for x in o], 0, duration_s)
