"""How fast a pipeline gets through its work, so that a request its budget cannot cover is told
at once instead of taking a share of the cores it would only waste.

Requests in flight share the services' cores. When more arrive than the cores can answer
within the clients' budgets, every one of them finishes late: 32 clients sending OCR pages
with 1.5 s budgets got 43 answers in 30 s, against 91 in 20 s from two such clients
(bench/README, 2026-11-30). The requests in flight share the pipeline's pace as processor
sharing would: a virtual clock advances by the pipeline's rate over the requests in flight,
so each request's work left is its work less what the clock gave it since it came. A request
of work w arriving now waits for min(w, what is left) of each request in flight and its
own w, at the pipeline's rate; one whose remaining budget is shorter than that is refused
(503 with Retry-After) before it takes any of the cores.

Work is counted in pixels for image inputs (what `max_inflight_mpx` bounds: an OCR page
costs about its pixels) and one unit otherwise. The rate is read only while two or more
requests share the pipeline: one at a time runs its services one after the other, well
under the cores' pace, and a burst judged at that pace was refused work it could do in time
(bench/README). It forgets with a half-life, so a change of load or of the services' speed
is followed within seconds.
"""

from __future__ import annotations

import math
import time

HALF_LIFE_S = 5.0
"""How fast what was measured fades: a pipeline that sped up or slowed down is read anew
within a few seconds."""
MIN_DONE = 3.0
"""Requests ended while sharing the pipeline (decayed) before its rate is trusted: none is
refused before."""
SHARED = 2
"""Requests in flight from which the pipeline's rate is read (and a request may be
refused: admission.py)."""
MIN_COST_S = 0.01
"""The pipeline's busy time a request takes on average, below which none is refused. A
refusal costs the proxy an HTTP exchange (~0.1-0.2 ms here); where a request costs the mesh
not much more, refusing saves nothing, and clients that send again at once only take the
proxy's time from the requests it took: `digits` (~1 ms a request at c=32) with 20 ms
budgets answered 220-395 req/s in time with refusals, 823-1,166 without (bench/README)."""


class Pace:
    """One pipeline's requests in flight, the work each has left, and the rate it gets
    through work while shared."""

    def __init__(self) -> None:
        self._flights: dict[int, tuple[float, int]] = {}
        """Per request in flight: the virtual clock when it came, and its work."""
        self._tokens = 0
        self._clock = 0.0
        """Work each request in flight has received, were they served in equal shares."""
        self._done = 0.0
        """Work answered while shared (decayed)."""
        self._ended = 0.0
        """Requests out of flight while shared, answered or not (decayed)."""
        self._busy_s = 0.0
        """Seconds shared (decayed)."""
        self._at = time.monotonic()

    @property
    def running(self) -> int:
        """Requests in flight."""
        return len(self._flights)

    def _rate(self) -> float | None:
        """Work a second while shared; None while too few requests ended to say."""
        if self._ended < MIN_DONE or self._busy_s <= 0:
            return None
        return self._done / self._busy_s

    def _advance(self) -> None:
        now = time.monotonic()
        elapsed = now - self._at
        if elapsed <= 0:
            return
        self._at = now
        running = self.running
        if running and (rate := self._rate()):
            self._clock += rate * elapsed / running
        keep = 0.5 ** (elapsed / HALF_LIFE_S)
        self._done *= keep
        self._ended *= keep
        self._busy_s = self._busy_s * keep + (elapsed if running >= SHARED else 0.0)

    def started(self, work: int) -> int:
        """A request in flight; its token for `ended`."""
        self._advance()
        self._tokens += 1
        self._flights[self._tokens] = (self._clock, work)
        return self._tokens

    def ended(self, token: int, answered: bool) -> None:
        """One request out of flight; `answered`: it did not run out of time. One that did
        took the pipeline's time without getting its work through: a pipeline where most
        run out is read as slow, and sheds until they are answered again."""
        self._advance()
        if self.running >= SHARED:  # counting this one
            self._ended += 1
            if answered:
                self._done += self._flights[token][1]
        del self._flights[token]

    def expected_s(self, work: int) -> float | None:
        """Seconds a request of `work` arriving now is expected to take (inf: of late,
        none got through in time); None while the pipeline has not been shared by enough
        requests to say, or where they cost too little for a refusal to save anything
        (MIN_COST_S)."""
        self._advance()
        if self._ended < MIN_DONE or self._busy_s < MIN_COST_S * self._ended:
            return None
        rate = self._rate()
        if not rate:
            return math.inf  # busy, and nothing got through in time
        ahead = sum(min(work, left) for left in self._left())
        return (ahead + work) / rate

    def next_end_s(self) -> float | None:
        """Seconds until the first request in flight is expected to end, each getting an
        equal share of the pipeline's pace (None: nothing in flight, or no pace known yet):
        when a pipeline at its limits may have room again (its 503's Retry-After). A hint,
        not a refusal: read from any work answered while shared (MIN_DONE not needed; three
        OCR pages at a time end two while shared a round, forgotten by the next)."""
        self._advance()
        if not self._flights or self._done <= 0 or self._busy_s <= 0:
            return None
        rate = self._done / self._busy_s
        return min(self._left()) * self.running / rate

    def _left(self) -> list[float]:
        """The work each request in flight has left, by the virtual clock."""
        return [max(0.0, w - (self._clock - came)) for came, w in self._flights.values()]
