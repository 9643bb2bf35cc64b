"""How fast a pipeline gets through image pixels, measured as it runs, so that admission
(admission.py) takes only the pages it can answer within their budget.

A fixed limit of megapixels in flight is right for one machine only: 32 Mpx was three
3000x3000 pages answered in 12-13 s of a 15 s budget on the two cores it was chosen on, and
a page too many on a machine a fifth slower (CI's) or busier was answered 504 after
holding its share of the CPU for 15 s. The rate here is pixels answered per second that the
pipeline had work in flight, over its last answers: what it does, on this machine, with
the replicas it has. A request whose pixels, added to those in flight, would take longer
than its budget at that rate is told at once to come back (503 + Retry-After), as one
past the fixed limit is. The estimate is cautious (the pixels in flight count whole,
though part of them is done; work cancelled midway is not credited) and never refuses a
request when the pipeline is idle.
"""

from __future__ import annotations

import time
from collections import deque

WINDOW = 8
"""Answers the rate is taken over."""


class PixelPace:
    """Pixels answered per busy second of one pipeline."""

    def __init__(self) -> None:
        self._busy_s = 0.0
        """Seconds with at least one request in flight, up to the current stretch."""
        self._since = 0.0
        """When the current busy stretch began."""
        self._running = 0
        self._answered: deque[tuple[float, int]] = deque([(0.0, 0)], maxlen=WINDOW + 1)
        """(busy seconds when answered, pixels), after the answer before the window."""

    def _busy_now(self, now: float) -> float:
        return self._busy_s + (now - self._since if self._running else 0.0)

    def started(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self._running == 0:
            self._since = now
        self._running += 1

    def ended(self, pixels: int, answered: bool, now: float | None = None) -> None:
        """A request of `pixels` ended; `answered`: it did the whole work (not cancelled or
        failed midway), so its pixels count."""
        now = time.monotonic() if now is None else now
        busy = self._busy_now(now)
        self._running -= 1
        if self._running == 0:
            self._busy_s = busy
        if answered and pixels:
            self._answered.append((busy, pixels))

    def rate(self) -> float | None:
        """Pixels per busy second over the last answers; None before any."""
        if len(self._answered) < 2:
            return None
        seconds = self._answered[-1][0] - self._answered[0][0]
        pixels = sum(p for _, p in list(self._answered)[1:])
        return pixels / seconds if seconds > 0 else None

    def seconds_for(self, pixels: int) -> float | None:
        """How long `pixels` take at the measured rate; None before it is known."""
        rate = self.rate()
        return None if rate is None else pixels / rate
