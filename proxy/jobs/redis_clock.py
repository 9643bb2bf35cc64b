"""The one clock the replicas sharing a Redis queue agree on: Redis's own (`TIME`).

Leases, back-offs, callbacks' due times and expiries are written by one replica and compared
by another. On each replica's own clock, a replica an hour ahead (a VM resumed, NTP broken)
saw every other replica's lease as an hour old and took over their running jobs as soon as
it claimed. Redis's clock is read every CLOCK_EVERY_S, by one call at a time (the others go
on with the last reading, or wait for the first one); in between, this process's clock plus
the difference last read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

CLOCK_EVERY_S = 30.0
"""How often Redis's clock is read again (this process's may be stepped meanwhile)."""


class RedisClock:
    def __init__(self, read: Callable[[], Awaitable[tuple[int, int]]]) -> None:
        """`read`: Redis's TIME, (seconds, microseconds)."""
        self._read = read
        self._offset = 0.0
        """Redis's clock less this process's."""
        self._read_at = float("-inf")
        self._reading: asyncio.Future[None] | None = None

    async def now(self) -> float:
        """Now on Redis's clock, epoch seconds."""
        if time.monotonic() - self._read_at >= CLOCK_EVERY_S:
            if self._reading is None:
                self._reading = asyncio.ensure_future(self._read_offset())
                self._reading.add_done_callback(self._done)
            if self._read_at == float("-inf"):  # never read: wait for the first reading
                await asyncio.shield(self._reading)
        return self.clock()

    async def settle(self) -> None:
        """Until a reading under way is over (before its client closes: a reading after
        the close would open a connection nobody closes)."""
        if self._reading is not None:
            await asyncio.gather(self._reading, return_exceptions=True)

    def clock(self) -> float:
        """`now` as last read, without waiting."""
        return time.time() + self._offset

    async def _read_offset(self) -> None:
        before = time.time()
        seconds, micros = await self._read()
        after = time.time()
        # Redis answered between the two readings: its clock less their midpoint is right
        # within half the round trip (~0.1 ms here, a few ms under load; leases are 30 s).
        self._offset = seconds + micros / 1e6 - (before + after) / 2
        self._read_at = time.monotonic()

    def _done(self, reading: asyncio.Future[None]) -> None:
        self._reading = None
        if not reading.cancelled():
            reading.exception()  # a failed reading (the caller waiting has it): tried again
