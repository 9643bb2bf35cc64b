"""When to wait for company and where to run: the batcher's adaptive decisions.

The wait pays while batches hold other requests or requests arrive closer together than
the configured delay (moving averages of both), unless the batches that waited of late
found no company: a caller that sends its next request only once answered (one client,
one request at a time) arrives closer together than the delay and yet never joins a batch
held open for it (a predictor called so, 1 ms delay: 1.06 ms a round trip against 0.62 ms
unbatched). Such waits are tried again once every PROBE_S: until then a burst of requests
cheap enough to run on the loop, right after one client's requests one at a time, runs one
by one (each at once); requests that come while one runs queue and merge as before.
Otherwise (low load) a batch closes at once, and a request that finds nothing queued or
running is run by its own caller, with no hand-off to the worker. At c=1 this saves the
delay plus a timer wake-up and a task hop (~1.5-2 ms per call for a 1 ms delay on a small
VM). Executions cheaper than a thread hand-off (~0.2-0.5 ms on small VMs) run on the event
loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from protos.codec import content_bytes

Tensors = dict[str, np.ndarray]

PROBE_S = 1.0
"""How often a batch waits again after waits found no company (it costs one delay)."""


class AdaptivePolicy:
    def __init__(
        self,
        max_delay_s: float,
        inline_below_s: float,
        inline_max_bytes: int,
        weigh: Callable[[Tensors], int] | None = None,
    ) -> None:
        self.max_delay_s = max_delay_s
        self._inline_below = inline_below_s
        self._inline_max_bytes = inline_max_bytes
        self._weigh = weigh or payload_bytes
        """A request's bytes of work, against `inline_max_bytes`: what it carries, unless
        the model says more (a recipe counts its images as decoded)."""
        self._mean_s = float("inf")
        """Moving average of one execution's duration, measured where it runs."""
        self._company = 1.0
        """Moving average of the other requests each batch held; starts as if batching
        pays, as a server that has seen no traffic cannot know."""
        self._gap_cap = 10 * max_delay_s
        self._gap = self._gap_cap
        """Moving average of the time between arrivals (each gap capped, so that a busy
        spell after a quiet one shows within a few arrivals)."""
        self._last_arrival: float | None = None
        self._waited_company = self._company
        """Moving average of the other requests each batch held open for company got."""
        self._probe_at = 0.0
        """When a batch may wait again for the gap alone after waits found no company."""

    def seed(self, seconds: float) -> None:
        """Start the execution-time average from a measured run (the warm-up)."""
        self._mean_s = seconds

    def timed(self, run: Callable[[Tensors], Tensors], inputs: Tensors) -> Tensors:
        """Run, and fold the duration into the execution-time average."""
        start = time.perf_counter()
        try:
            return run(inputs)
        finally:
            elapsed = time.perf_counter() - start
            mean = self._mean_s
            self._mean_s = elapsed if mean == float("inf") else 0.9 * mean + 0.1 * elapsed

    def runs_inline(self, inputs: Tensors) -> bool:
        return self._mean_s < self._inline_below and self._weigh(inputs) <= self._inline_max_bytes

    def arrived(self, now: float) -> None:
        """A request came at `now` (time.perf_counter(): uvloop's clock counts whole
        milliseconds, the size of the gaps measured here)."""
        if self._last_arrival is not None:
            gap = min(now - self._last_arrival, self._gap_cap)
            self._gap = 0.7 * self._gap + 0.3 * gap
        self._last_arrival = now

    def closed_batch(self, requests: int, waited: bool = False) -> None:
        """A batch of `requests` closed; `waited`: it was held open for company."""
        self._company = 0.8 * self._company + 0.2 * (requests - 1)
        if waited:
            self._waited_company = 0.8 * self._waited_company + 0.2 * (requests - 1)
            self._probe_at = time.perf_counter() + PROBE_S

    def batching_pays(self) -> bool:
        if self._company >= 0.5:
            return True
        if self._gap >= self.max_delay_s:
            return False
        if self._waited_company < 0.5:
            if time.perf_counter() < self._probe_at:
                return False
            self._waited_company = 0.5  # a probe: one batch waits; what it finds decides
        return True


def payload_bytes(inputs: Tensors) -> int:
    """Bytes a request carries (for BYTES tensors, their elements' lengths)."""
    return sum(content_bytes(arr) for arr in inputs.values())
