"""What the console shows of the requests this process answered: the last N, each with its
steps (a waterfall), and each step's latency percentiles over the last minute.

Kept in process, per proxy worker (with PROXY_WORKERS > 1 each worker knows its own
requests; Prometheus' histograms are the view across workers). Recording is a few deque
appends a request: the hot path pays nothing it would notice.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, NamedTuple

import numpy as np

from proxy.engine.run import Ended, StepStatus

WINDOW_S = 60.0
"""The live percentiles' window."""
SAMPLES = 1024
"""Latencies kept per step at most (the window is shorter at a high rate): reading a
full window takes ~0.2 ms, on the event loop."""
TOTAL = "(request)"
"""The name the whole request's latency is kept under, beside its steps'."""


class Answered(NamedTuple):
    """One request, as it is kept: a plain tuple (the hot path makes one a request); the
    figures the console reads are worked out when it reads them."""

    id: str
    pipeline: str
    status: str
    """The HTTP status the request was answered with (499: the client left)."""
    opened: float
    """perf_counter when the proxy took it."""
    ended: float
    steps: tuple[StepStatus, ...]
    cache: str | None
    partial: bool

    def to_json(self, wall_offset: float) -> dict[str, Any]:
        """`wall_offset`: time.time() - time.perf_counter(), now."""
        return {
            "id": self.id,
            "pipeline": self.pipeline,
            "status": self.status,
            "at": round(self.opened + wall_offset, 6),
            "latency_ms": round((self.ended - self.opened) * 1000, 3),
            "cache": self.cache,
            "partial": self.partial,
            "steps": [s.__dict__ for s in self.steps],
        }


def percentiles(samples: deque[tuple[float, float]], now: float) -> dict[str, float] | None:
    """count, p50_ms and p99_ms of the (perf_counter, ms) samples of the last WINDOW_S."""
    recent = [ms for t, ms in samples if now - t <= WINDOW_S]
    if not recent:
        return None
    p50, p99 = np.percentile(recent, [50, 99])
    return {"count": len(recent), "p50_ms": round(p50, 3), "p99_ms": round(p99, 3)}


class Recent:
    """The last `keep` requests and every step's latency window."""

    def __init__(self, keep: int) -> None:
        self.requests: deque[Answered] = deque(maxlen=keep)
        self.windows: dict[tuple[str, str], deque[tuple[float, float]]] = {}

    def add(self, ended: Ended) -> None:
        """A request that ended."""
        now = time.perf_counter()
        steps_ = tuple(ended.steps)
        run, pipeline, status = ended.run, ended.pipeline, ended.status
        cache, partial = (None, False) if run is None else (run.cache, run.partial)
        self.requests.append(
            Answered(ended.request_id, pipeline, status, ended.opened, now, steps_, cache, partial)
        )
        windows = self.windows
        if status == "200":
            window = windows.get((pipeline, TOTAL))
            if window is None:
                window = windows[pipeline, TOTAL] = deque(maxlen=SAMPLES)
            window.append((now, (now - ended.opened) * 1000))
        for step in steps_:
            if step.status == "ok" or step.status == "partial":
                window = windows.get((pipeline, step.name))
                if window is None:
                    window = windows[pipeline, step.name] = deque(maxlen=SAMPLES)
                window.append((now, step.latency_ms))

    def last(self, limit: int, pipeline: str | None = None) -> list[dict[str, Any]]:
        """The newest first."""
        chosen = [r for r in reversed(self.requests) if pipeline in (None, r.pipeline)]
        wall_offset = time.time() - time.perf_counter()
        return [r.to_json(wall_offset) for r in chosen[:limit]]

    def latency(self) -> dict[str, dict[str, dict[str, float]]]:
        """pipeline -> step (TOTAL: the whole request) -> count, p50_ms, p99_ms, over the
        last WINDOW_S seconds of answered calls."""
        now = time.perf_counter()
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (pipeline, step), samples in sorted(self.windows.items()):
            figures = percentiles(samples, now)
            if figures is not None:
                out.setdefault(pipeline, {})[step] = figures
        return out
