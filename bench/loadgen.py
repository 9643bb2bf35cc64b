"""Closed-loop load: N workers, each sending its next request when the last one returns."""

from __future__ import annotations

import asyncio
import gc
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


def _client_heap_set_aside() -> None:
    """The benchmark's own objects (its imports: numpy, scikit-learn for the samples, the
    mesh's modules; ~120,000) set aside from the client's garbage collector: each of its
    full passes walked them all, ~70-90 ms in which none of the client's answers were read,
    counted as the servers' latency (every connection at once: the max and p99.9 of a
    closed loop at c=32, measured against `/healthz` and job submissions)."""
    gc.collect()
    gc.freeze()


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
    _client_heap_set_aside()
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
    _client_heap_set_aside()
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
