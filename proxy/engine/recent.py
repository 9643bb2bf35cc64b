"""What the console shows of the requests this process answered: the last N, each with its
steps (a waterfall), and each step's latency percentiles over the last minute.

Kept in process, per proxy worker (with PROXY_WORKERS > 1 each worker knows its own
requests; Prometheus' histograms are the view across workers). Recording is a few deque
appends a request: the hot path pays nothing it would notice.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from proxy.engine.executor import StepStatus

WINDOW_S = 60.0
"""The live percentiles' window."""
SAMPLES = 4096
"""Latencies kept per step at most (the window is shorter at a high rate)."""
TOTAL = "(request)"
"""The name the whole request's latency is kept under, beside its steps'."""


@dataclass(frozen=True)
class Answered:
    """One request, as the console lists it."""

    id: str
    pipeline: str
    status: str
    """The HTTP status the request was answered with (499: the client left)."""
    at: float
    """Wall clock (epoch seconds) when the proxy took it."""
    latency_ms: float
    steps: tuple[StepStatus, ...]
    cache: str | None = None
    partial: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pipeline": self.pipeline,
            "status": self.status,
            "at": self.at,
            "latency_ms": self.latency_ms,
            "cache": self.cache,
            "partial": self.partial,
            "steps": [s.__dict__ for s in self.steps],
        }


@dataclass
class Window:
    """One step's recent latencies (monotonic time, milliseconds)."""

    samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=SAMPLES))

    def percentiles(self, now: float) -> dict[str, float] | None:
        recent = [ms for t, ms in self.samples if now - t <= WINDOW_S]
        if not recent:
            return None
        p50, p99 = np.percentile(recent, [50, 99])
        return {"count": len(recent), "p50_ms": round(p50, 3), "p99_ms": round(p99, 3)}


class Recent:
    """The last `keep` requests and every step's latency window."""

    def __init__(self, keep: int) -> None:
        self.requests: deque[Answered] = deque(maxlen=keep)
        self.windows: dict[tuple[str, str], Window] = {}

    def add(
        self,
        pipeline: str,
        request_id: str,
        status: str,
        opened: float,
        steps: list[StepStatus],
        cache: str | None = None,
        partial: bool = False,
    ) -> None:
        """A request that ended; `opened`: perf_counter when the proxy took it."""
        now = time.perf_counter()
        latency_ms = round((now - opened) * 1000, 3)
        at = time.time() - (now - opened)
        self.requests.append(
            Answered(request_id, pipeline, status, at, latency_ms, tuple(steps), cache, partial)
        )
        moment = time.monotonic()
        if status == "200":
            self._window(pipeline, TOTAL).samples.append((moment, latency_ms))
        for step in steps:
            if step.status in ("ok", "partial"):
                self._window(pipeline, step.name).samples.append((moment, step.latency_ms))

    def _window(self, pipeline: str, step: str) -> Window:
        window = self.windows.get((pipeline, step))
        if window is None:
            window = self.windows[pipeline, step] = Window()
        return window

    def last(self, limit: int, pipeline: str | None = None) -> list[dict[str, Any]]:
        """The newest first."""
        chosen = [r for r in reversed(self.requests) if pipeline in (None, r.pipeline)]
        return [r.to_json() for r in chosen[:limit]]

    def latency(self) -> dict[str, dict[str, dict[str, float]]]:
        """pipeline -> step (TOTAL: the whole request) -> count, p50_ms, p99_ms, over the
        last WINDOW_S seconds of answered calls."""
        now = time.monotonic()
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (pipeline, step), window in sorted(self.windows.items()):
            figures = window.percentiles(now)
            if figures is not None:
                out.setdefault(pipeline, {})[step] = figures
        return out
