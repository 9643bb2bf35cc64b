"""Telling a stalled call from a slow one, for the merged-call lanes (merging.py) and
the balancer (balancing.py).

A call is *stalled* once it has been out longer than `stall_after()`: several times the
recent typical latency of the same kind of call, never less than a floor. A stalled call
keeps its chance to answer (it is not cancelled here), but it no longer counts as the
work that holds a lane's slot or makes a replica busy: the calls behind it go on, to another
replica when there is one. The floor keeps an idle lane's first slow call (a cold cache, a
big image) from looking stalled; the factor keeps a lane whose calls are all slow (OCR)
from seeing stalls everywhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

STALL_FLOOR_S = 0.05
"""No call is stalled before this (a replica frozen for less is not worth a second call)."""

STALL_FACTOR = 8.0
"""A call is stalled after this many times the recent typical latency of its kind."""


@dataclass
class Pace:
    """The recent typical latency of one kind of call (an exponentially weighted mean of the
    calls that answered), and when a call of that kind counts as stalled."""

    typical_s: float = 0.0
    weight: float = 0.1
    floor_s: float = STALL_FLOOR_S
    factor: float = STALL_FACTOR

    def observe(self, seconds: float) -> None:
        if self.typical_s == 0.0:
            self.typical_s = seconds
        else:
            self.typical_s += self.weight * (seconds - self.typical_s)

    def stall_after(self) -> float:
        return max(self.floor_s, self.factor * self.typical_s)


@dataclass
class InFlight:
    """Calls out now, by when each left (oldest first: a dict keeps insertion order)."""

    started: dict[int, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.started)

    def begin(self, token: int, now: float | None = None) -> None:
        self.started[token] = time.monotonic() if now is None else now

    def end(self, token: int) -> float:
        """The call's age when it ended (0 when it was not out)."""
        began = self.started.pop(token, None)
        return 0.0 if began is None else time.monotonic() - began

    def busy(self, now: float, stall_after: float) -> int:
        """Calls out that are not (yet) stalled."""
        return sum(1 for began in self.started.values() if now - began < stall_after)

    def until_next_stall(self, now: float, stall_after: float) -> float | None:
        """Seconds until the oldest call that has not stalled yet does; None: none is out."""
        busy = [began for began in self.started.values() if now - began < stall_after]
        return min(busy) + stall_after - now if busy else None

    def oldest(self) -> float | None:
        """When the oldest call still out left."""
        return next(iter(self.started.values()), None)

    def stalled(self, now: float, stall_after: float) -> bool:
        oldest = self.oldest()
        return oldest is not None and now - oldest >= stall_after
