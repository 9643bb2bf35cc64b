"""Shadow calls: a copy of a step's live calls sent to a candidate model, its answers compared
with the live model's and counted, never returned.

The serving patterns' shadow A/B test (Seldon Core's mirror, Istio's traffic mirroring): before
a predictor is swapped by its environment variable, `<VARIABLE>_SHADOW` points a copy of its
calls at the candidate, and the metrics tell how often the two agree, output by output, and
how fast the candidate answers the same calls.

The client's answer, its latency and its errors stay the live model's alone:
- a copy is sent once the live call has answered (a failed live call has nothing to compare);
- it runs in the background, with the pipeline's own budget from then, and is never retried;
- when too many copies are in flight, or they hold too many bytes, the next is skipped and
  counted, never queued: a slow or dead candidate costs the live traffic nothing but its
  share of the cores (a dead one is refused at once by its breaker, transport/breaker.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from protos import tracing
from protos.metric_types import Counter, Histogram
from proxy.engine.step_spans import shadow_span
from proxy.errors import StepError
from proxy.transport.target import Target

if TYPE_CHECKING:
    from proxy.transport.calls import Call, Calls

log = logging.getLogger("proxy.shadows")

MAX_IN_FLIGHT = 64
"""Copies in flight at once, over every shadow of the process; beyond, skipped."""
MAX_BYTES = 64 << 20
"""Bytes of inputs the copies in flight may hold (a request's tensors outlive it in its copy)."""
RTOL, ATOL = 1e-3, 1e-5
"""Floating-point outputs within these (numpy.allclose) count as the same: a model converted
to another runtime or exported again reads alike, a retrained one does not."""

CALLS = Counter(
    "proxy_shadow_calls_total",
    "Copies of a step's calls sent to its shadow (<VARIABLE>_SHADOW), by pipeline, step "
    "(<parallel step>/<branch> for a branch) and outcome: answered, failed, or skipped (too "
    "many copies in flight)",
    ["pipeline", "step", "outcome"],
)
OUTPUTS = Counter(
    "proxy_shadow_outputs_total",
    "A shadow's answered outputs against the live model's, by pipeline, step, output and "
    "outcome: same (equal; floats within rtol 1e-3, atol 1e-5), differs, or missing",
    ["pipeline", "step", "output", "outcome"],
)
DIFFERENCE = Histogram(
    "proxy_shadow_max_abs_difference",
    "The largest absolute difference between a shadow's numeric output and the live one's "
    "(same shape only)",
    ["pipeline", "step", "output"],
    buckets=(0, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 10, float("inf")),
)
LATENCY = Histogram(
    "proxy_shadow_duration_seconds",
    "Latency of the copies sent to a shadow, by pipeline and step (compare "
    "proxy_step_duration_seconds of the live calls)",
    ["pipeline", "step"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


@dataclass(frozen=True)
class Shadow:
    """Where a copy of a step's calls goes, and how many of them (percent)."""

    target: Target
    percent: float


class Shadows:
    """The copies of this process in flight, bounded in number and bytes."""

    def __init__(
        self, calls: Calls, max_in_flight: int = MAX_IN_FLIGHT, max_bytes: int = MAX_BYTES
    ) -> None:
        self._calls = calls
        self._max_in_flight = max_in_flight
        self._max_bytes = max_bytes
        self._tasks: set[asyncio.Task[None]] = set()
        self._bytes = 0

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def copy(
        self,
        pipeline: str,
        label: str,
        shadow: Shadow,
        live: Call,
        feeds: Mapping[str, np.ndarray],
        answer: Mapping[str, np.ndarray],
        budget_s: float,
        request_id: str,
    ) -> None:
        """Send `feeds` to the shadow in the background and compare its answer with `answer`,
        the live call's; returns at once."""
        if shadow.percent < 100 and random.random() * 100 >= shadow.percent:
            return
        size = sum(a.nbytes for a in feeds.values())
        if len(self._tasks) >= self._max_in_flight or self._bytes + size > self._max_bytes:
            CALLS.labels(pipeline, label, "skipped").inc()
            if tracing.ENABLED and (step := tracing.current()) is not None:
                step.set_attribute("mesh.shadow.outcome", "skipped")  # no copy, so no span
            return
        # The live call's, to the shadow, never retried (a Call is a small frozen record).
        spec = dataclasses.replace(live, label=f"{label} (shadow)", target=shadow.target, retries=0)
        deadline = asyncio.get_running_loop().time() + budget_s
        # A callable, not a coroutine: a copy cancelled before it starts (close) leaves no
        # coroutine never awaited.
        call = functools.partial(self._calls.call, spec, dict(feeds), deadline, request_id)
        self._bytes += size
        compared = self._compare(pipeline, label, shadow.target, call, dict(answer), request_id)
        task = asyncio.create_task(compared)
        self._tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            self._bytes -= size

        task.add_done_callback(done)

    async def _compare(
        self,
        pipeline: str,
        label: str,
        target: Target,
        call: Callable[[], Awaitable[Mapping[str, np.ndarray]]],
        live: dict[str, np.ndarray],
        request_id: str,
    ) -> None:
        # Made in the task, whose context is the step's: the span is the step's child.
        with shadow_span(label, target) if tracing.ENABLED else tracing.NO_SPAN as span:
            start = time.perf_counter()
            try:
                answer = await call()
            except StepError as exc:
                CALLS.labels(pipeline, label, "failed").inc()
                log.debug("shadow of %s (request %s) failed: %s", label, request_id, exc.message)
                if span is not None:
                    span.set_attribute("mesh.shadow.outcome", "failed")
                    tracing.error(span, exc.message)
                return
            finally:
                LATENCY.labels(pipeline, label).observe(time.perf_counter() - start)
            CALLS.labels(pipeline, label, "answered").inc()
            unlike = []
            for name, value in live.items():
                outcome, difference = compare(value, answer.get(name))
                OUTPUTS.labels(pipeline, label, name, outcome).inc()
                if difference is not None:
                    DIFFERENCE.labels(pipeline, label, name).observe(difference)
                if outcome != "same":
                    unlike.append(f"{name} {outcome}")
                    log.debug("shadow of %s (request %s): %s %s", label, request_id, name, outcome)
            if span is not None:
                span.set_attribute("mesh.shadow.outcome", "answered")
                span.set_attribute("mesh.shadow.differs", ", ".join(unlike))

    async def close(self) -> None:
        """Cancel the copies still in flight (the proxy is stopping: nobody waits for them)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def compare(live: np.ndarray, shadow: np.ndarray | None) -> tuple[str, float | None]:
    """same / differs / missing, and the largest absolute difference where both are numeric
    arrays of one shape."""
    if shadow is None:
        return "missing", None
    if live.shape != shadow.shape:
        return "differs", None
    numeric = live.dtype.kind in "biuf" and shadow.dtype.kind in "biuf"
    if not numeric:
        return ("same" if np.array_equal(live, shadow) else "differs"), None
    if live.size == 0:
        return "same", 0.0
    a, b = live.astype(np.float64), shadow.astype(np.float64)
    with np.errstate(invalid="ignore"):
        gap = np.where(a == b, 0.0, np.abs(a - b))  # equal infinities differ by nothing
    gap[np.isnan(a) & np.isnan(b)] = 0.0
    unlike = np.isnan(gap)  # NaN on one side only
    difference = float("inf") if unlike.any() else float(gap.max())
    if "f" in (live.dtype.kind, shadow.dtype.kind):
        same = not unlike.any() and bool(np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True))
    else:
        same = difference == 0.0
    return ("same" if same else "differs"), difference
