"""One pipeline's room: its limits, the requests and image pixels it works on, the requests
waiting for room, first come first served, and its pace (engine/pace.py).

A request that finds the pipeline at its limits waits for room while the pipeline's pace
says it would still be answered within its budget, as Triton's scheduler queues a request
until its timeout and Ray Serve's router holds it up to `max_queued_requests`. Waiting takes
none of the services' cores: only the requests let in share them, so those stay in time
(a crowd let in at once made every answer late: 32 clients sending 3000x3000 pages, 3 of 65
answered in time). Four clients sending 7 Mpx scans to `ocr` (three fit its 24 Mpx) had 21
of 24 refused 503 at once while each page would have been answered within its 15 s.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field

from proxy import metrics
from proxy.engine.pace import Pace
from proxy.errors import Problem

MOST_WAIT_S = 30
"""The longest Retry-After a pipeline tells: a pace read from little (one stalled request,
nothing answered for long) may say hours."""


@dataclass(frozen=True)
class PipelineLimits:
    max_in_flight: int | None = None
    max_pixels: int | None = None
    max_queued: int | None = None
    """Requests waiting for room at once (None: as many as their budgets allow; 0: none)."""


@dataclass(eq=False)
class Waiter:
    pixels: int
    background: bool
    """A job's: never told to go for its budget (jobs are not shed), counted as a job's."""
    due: float
    """When its budget ends (monotonic)."""
    room: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    """Done when its room is reserved, or with the 503 that it need not wait longer."""

    @property
    def work(self) -> int:
        return max(self.pixels, 1)

    def handed(self) -> bool:
        """Whether its room was reserved (to give back if it left before taking it)."""
        room = self.room
        return room.done() and not room.cancelled() and room.exception() is None


class Room:
    """One pipeline's limits and what it holds of them."""

    def __init__(self, name: str, limits: PipelineLimits, paced: bool) -> None:
        self.name = name
        self.limits = limits
        self.in_flight = 0
        self.pixels = 0
        self.line: deque[Waiter] = deque()
        """The requests waiting for room, in the order they came."""
        self.queued = 0
        """Their work (pixels, at least 1 each)."""
        self._waiting = metrics.WAITING.labels(name)
        self.pace = Pace() if paced else None
        """Its work in flight and how fast it answers; None while shedding is off (a request
        then pays nothing for it)."""

    def fits(self, pixels: int) -> bool:
        """Whether a request of `pixels` fits beside those in flight (an image larger than
        the whole pixel budget passes alone)."""
        limits = self.limits
        if limits.max_in_flight is not None and self.in_flight >= limits.max_in_flight:
            return False
        held = self.pixels
        return limits.max_pixels is None or not held or held + pixels <= limits.max_pixels

    def takes_waiters(self) -> bool:
        return self.limits.max_queued is None or len(self.line) < self.limits.max_queued

    def join(self, pixels: int, background: bool, due: float) -> Waiter:
        waiter = Waiter(pixels, background, due)
        self.line.append(waiter)
        self.queued += waiter.work
        self._waiting.inc()
        return waiter

    def leave(self, waiter: Waiter) -> bool:
        """`waiter` out of the line, if it is still in it (its task left: a hang-up, its
        budget spent)."""
        try:
            self.line.remove(waiter)
        except ValueError:
            return False
        self.queued -= waiter.work
        self._waiting.dec()
        return True

    def let_in(self, now: float) -> list[Waiter]:
        """The first waiters that fit now, out of the line with their room reserved here;
        one the work in flight would now outlast is told so (503) instead: let in with too
        little of its budget left, it only took the cores to time out in a service (32
        clients sending 6000x6000 photos to `digits`)."""
        handed = []
        line = self.line
        while line and self.fits(line[0].pixels):
            waiter = line.popleft()
            self.queued -= waiter.work
            self._waiting.dec()
            if waiter.room.done():  # cancelled: its task is leaving
                continue
            expected = self._expected(waiter, 0.0, 0)
            if expected is not None and expected > waiter.due - now:
                waiter.room.set_exception(self.late(expected, waiter.due - now))
                continue
            self.in_flight += 1
            self.pixels += waiter.pixels
            waiter.room.set_result(None)
            handed.append(waiter)
        return handed

    def tell_late(self, now: float) -> None:
        """Waiters the work ahead of them would now outlast, told so (503) rather than left
        to time out: the pace read from a crowd's first answers decides."""
        if self.pace is None:
            return
        queued, count = 0.0, 0
        for waiter in list(self.line):
            expected = self._expected(waiter, queued, count)
            if expected is None and not waiter.background:
                return
            if expected is not None and expected > waiter.due - now:
                self.leave(waiter)
                if not waiter.room.done():
                    waiter.room.set_exception(self.late(expected, waiter.due - now))
            else:
                queued += waiter.work
                count += 1

    def _expected(self, waiter: Waiter, queued: float, count: int) -> float | None:
        """Seconds `waiter` would take behind the work in flight and `count` requests of
        `queued` work waiting before it (None: the pace does not say, or a job's: jobs wait
        their turn)."""
        if self.pace is None or waiter.background:
            return None
        return self.pace.queued_s(waiter.work, queued)

    def late(self, expected: float, left_s: float) -> Problem:
        """The 503 of a request the work ahead of it would outlast, `expected` seconds."""
        metrics.SHED.labels(self.name).inc()
        if math.isinf(expected):
            ahead, wait_s = "none of its recent requests was answered in time", 1
        else:
            # Come back once the work ahead, were none added, would fit this budget.
            ahead = f"~{expected:.2f} s of work ahead at its pace now"
            wait_s = min(MOST_WAIT_S, max(1, math.ceil(expected - left_s)))
        return Problem(
            503,
            f"pipeline '{self.name}' would not answer within the request's budget: "
            f"{ahead}, {left_s:.2f} s left",
            retry_after=str(wait_s),
        )

    def at_capacity(self) -> Problem:
        """The 503 of a request that may not wait for room (no budget, the line full)."""
        limits, what = self.limits, f"{self.in_flight} requests in flight"
        full = limits.max_in_flight is not None and self.in_flight >= limits.max_in_flight
        if not full and limits.max_pixels is not None and self.pixels:
            what = f"{self.pixels / 1e6:.1f} of {limits.max_pixels / 1e6:g} megapixels in flight"
        if self.line:
            what += f", {len(self.line)} waiting for room"
        return Problem(
            503, f"pipeline '{self.name}' at capacity ({what})", retry_after=self._room_in()
        )

    def _room_in(self) -> str | None:
        """Retry-After for a pipeline at its limits: the seconds until its first request in
        flight is expected to end (engine/pace.py), 1 to MOST_WAIT_S; None (the default,
        1 s) while its pace is not known. Four clients sending 7 Mpx scans to `ocr` were
        told 1 s, and came back while the three pages it held needed ~7 s more."""
        wait_s = None if self.pace is None else self.pace.next_end_s()
        return None if wait_s is None else str(min(MOST_WAIT_S, max(1, math.ceil(wait_s))))
