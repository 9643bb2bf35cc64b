"""How fast a pipeline gets through its work, so that a request its budget cannot cover is told
at once instead of taking a share of the cores it would only waste.

Requests in flight share the services' cores. When more arrive than the cores can answer
within the clients' budgets, every one of them finishes late: 32 clients sending OCR pages
with 1.5 s budgets got 43 answers in 30 s, against 91 in 20 s from two such clients
(bench/README, 2026-11-30). By Little's law a request arriving now takes, on average, the
work in flight plus its own over the rate at which the pipeline gets through work while it
has any; a request whose remaining budget is shorter than that is refused (503 with
Retry-After) before it takes any of the cores.

Work is counted in pixels for image inputs (what `max_inflight_mpx` bounds: an OCR page
costs about its pixels) and one unit otherwise. The rate forgets with a half-life, so a
change of load or of the services' speed is followed within seconds.
"""

from __future__ import annotations

import math
import time

HALF_LIFE_S = 5.0
"""How fast what was measured fades: a pipeline that sped up or slowed down is read anew
within a few seconds."""
MIN_DONE = 3.0
"""Requests ended (decayed) before the rate is trusted: none is refused before."""
MIN_COST_S = 0.01
"""The pipeline's busy time a request takes on average, below which none is refused. A
refusal costs the proxy an HTTP exchange (~0.1-0.2 ms here); where a request costs the mesh
not much more, refusing saves nothing, and clients that send again at once only take the
proxy's time from the requests it took: `digits` (~1 ms a request at c=32) with 20 ms
budgets answered 220-395 req/s in time with refusals, 823-1,166 without (bench/README)."""


class Pace:
    """One pipeline's work in flight and the rate it answers work at while busy."""

    def __init__(self) -> None:
        self.running = 0
        """Requests in flight."""
        self.held = 0
        """Their work."""
        self._done = 0.0
        """Work answered (decayed)."""
        self._ended = 0.0
        """Requests out of flight, answered or not (decayed)."""
        self._busy_s = 0.0
        """Seconds with any request in flight (decayed)."""
        self._at = time.monotonic()

    def _advance(self) -> None:
        now = time.monotonic()
        elapsed = now - self._at
        if elapsed <= 0:
            return
        self._at = now
        keep = 0.5 ** (elapsed / HALF_LIFE_S)
        self._done *= keep
        self._ended *= keep
        self._busy_s = self._busy_s * keep + (elapsed if self.running else 0.0)

    def started(self, work: int) -> None:
        self._advance()
        self.running += 1
        self.held += work

    def ended(self, work: int, answered: bool) -> None:
        """One request out of flight; `answered`: it did not run out of time. One that did
        took the pipeline's time without getting its work through: a pipeline where most
        run out is read as slow, and sheds until they are answered again."""
        self._advance()
        self.running -= 1
        self.held -= work
        self._ended += 1
        if answered:
            self._done += work

    def expected_s(self, work: int) -> float | None:
        """Seconds a request of `work` arriving now is expected to take (inf: of late,
        none got through in time); None while the pipeline has not seen enough requests to
        say, or where they cost too little for a refusal to save anything (MIN_COST_S)."""
        self._advance()
        if self._ended < MIN_DONE or self._busy_s < MIN_COST_S * self._ended:
            return None
        if self._done <= 0:
            return math.inf  # busy, and nothing got through in time
        return (self.held + work) * self._busy_s / self._done
