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
(bench/README). Each request that ends brings its work over its share of the pipeline (the
seconds it was served, each over the requests then in flight), so the first of a crowd to
end reads the pace right; it forgets with a half-life, so a change of load or of the
services' speed is followed within seconds. A pipeline never shared (`max_in_flight: 1`)
is read from its requests one at a time instead: the pace it runs at, for those waiting
for room.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

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


@dataclass
class _Reading:
    """What ended requests tell of a pipeline's pace (all decayed): how many ended, each by
    the part of its life read here; the seconds of the pipeline they had; the work they got
    through in time."""

    ended: float = 0.0
    seconds: float = 0.0
    done: float = 0.0

    def fade(self, keep: float) -> None:
        self.ended *= keep
        self.seconds *= keep
        self.done *= keep

    def add(self, part: float, seconds: float, done: float) -> None:
        self.ended += part
        self.seconds += seconds
        self.done += done

    def cheap(self) -> bool:
        """Whether its requests cost too little for a refusal to save anything."""
        return self.seconds < MIN_COST_S * self.ended


class Pace:
    """One pipeline's requests in flight, the work each has left, and the rate it gets
    through work while shared."""

    def __init__(self) -> None:
        self._flights: dict[int, tuple[float, int, float, float, float]] = {}
        """Per request in flight: the virtual clock when it came, its work, the share and
        shared clocks then, and when it came (monotonic)."""
        self._tokens = 0
        self._clock = 0.0
        """Work each request in flight has received, were they served in equal shares."""
        self._share = 0.0
        """Seconds of the pipeline each request in flight has had while shared: the
        seconds shared, each over the requests then in flight."""
        self._shared = 0.0
        """Seconds shared."""
        self._read = _Reading()
        """Requests while shared: each its share of the pipeline's seconds."""
        self._alone = _Reading()
        """Requests never shared, each the seconds it took: read only where none was
        shared (a pipeline that runs one request at a time)."""
        self._at = time.monotonic()

    @property
    def running(self) -> int:
        """Requests in flight."""
        return len(self._flights)

    @property
    def known(self) -> bool:
        """Whether any request has ended: until then nothing says how long a request
        waiting for room would take."""
        return self._reading().seconds > 0

    def _reading(self) -> _Reading:
        """The shared reading, or the one-at-a-time reading where none was shared."""
        return self._read if self._read.seconds > 0 else self._alone

    def _rate(self) -> float | None:
        """Work a second while shared; None while too few requests ended to say."""
        read = self._read
        if read.ended < MIN_DONE or read.seconds <= 0:
            return None
        return read.done / read.seconds

    def _advance(self) -> None:
        now = time.monotonic()
        elapsed = now - self._at
        if elapsed <= 0:
            return
        self._at = now
        running = self.running
        if running and (rate := self._rate() or self._alone_rate()):
            self._clock += rate * elapsed / running
        if running >= SHARED:
            self._share += elapsed / running
            self._shared += elapsed
        keep = 0.5 ** (elapsed / HALF_LIFE_S)
        self._read.fade(keep)
        self._alone.fade(keep)

    def _alone_rate(self) -> float | None:
        """Work a second one at a time, where nothing was read while shared."""
        alone = self._alone
        if self._read.seconds > 0 or alone.seconds <= 0:
            return None
        return alone.done / alone.seconds

    def started(self, work: int) -> int:
        """A request in flight; its token for `ended`."""
        self._advance()
        self._tokens += 1
        self._flights[self._tokens] = (self._clock, work, self._share, self._shared, self._at)
        return self._tokens

    def ended(self, token: int, answered: bool | None) -> None:
        """One request out of flight; `answered`: it did not run out of time (None: it
        says nothing of the pace, a failure or a client that left). One that ran out took
        the pipeline's time without getting its work through: a pipeline where most run
        out is read as slow, and sheds until they are answered again.

        Its work over its share of the pipeline is the pace as processor sharing serves
        it, whatever else was in flight: three 7 Mpx pages sent together, read as the work
        answered over the seconds shared, said 1 Mpx a second when the first ended (one
        page in the three pages' seconds), and the crowd behind them was told it would
        wait 25 s for what took 8."""
        self._advance()
        _, work, share, shared, came = self._flights.pop(token)
        if answered is None:
            return
        done = work if answered else 0
        share = self._share - share
        if share <= 0:  # never shared: the pace one at a time
            self._alone.add(1.0, self._at - came, done)
            return
        part = (self._shared - shared) / (self._at - came)
        self._read.add(part, share, done * part)

    def expected_s(self, work: int) -> float | None:
        """Seconds a request of `work` arriving now is expected to take (inf: of late,
        none got through in time); None while the pipeline has not been shared by enough
        requests to say, or where they cost too little for a refusal to save anything
        (MIN_COST_S)."""
        self._advance()
        if self._read.ended < MIN_DONE or self._read.cheap():
            return None
        rate = self._rate()
        if not rate:
            return math.inf  # busy, and nothing got through in time
        ahead = sum(min(work, left) for left in self._left())
        return (ahead + work) / rate

    def queued_s(self, work: int, queued: float) -> float | None:
        """Seconds a request of `work` waiting for room behind `queued` work of requests
        that wait before it is expected to take: all the work in flight and queued ahead,
        then its own, at the pipeline's pace (an upper bound while the pipeline stays busy:
        it works at its rate whoever holds its room). Read from any work answered while
        shared, as `next_end_s` (a crowd's first answers decide which of it may wait), or
        one at a time where none was shared; None while nothing says (no answer yet); inf
        when nothing got through in time of late. Requests that cost little are judged too
        (unlike arrivals, `expected_s`): a waiter the pace does not judge is let in however
        little of its budget is left, and 6000x6000 photos sent to `digits` after its ~1 ms
        requests waited out their budgets, let in to time out in the preprocessing."""
        self._advance()
        read = self._reading()
        if read.seconds <= 0:
            return None
        if read.done <= 0:
            return math.inf if read.ended >= MIN_DONE else None
        return (sum(self._left()) + queued + work) * read.seconds / read.done

    def next_end_s(self) -> float | None:
        """Seconds until the first request in flight is expected to end, each getting an
        equal share of the pipeline's pace (None: nothing in flight, or no pace known yet):
        when a pipeline at its limits may have room again (its 503's Retry-After). A hint,
        not a refusal: read from any work answered (MIN_DONE not needed; three OCR pages at
        a time end two while shared a round, forgotten by the next)."""
        self._advance()
        read = self._reading()
        if not self._flights or read.done <= 0 or read.seconds <= 0:
            return None
        return min(self._left()) * self.running * read.seconds / read.done

    def _left(self) -> list[float]:
        """The work each request in flight has left, by the virtual clock."""
        clock = self._clock
        return [max(0.0, work - (clock - came)) for came, work, *_ in self._flights.values()]
