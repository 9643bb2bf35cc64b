"""How many of a batch's requests are in flight: `concurrency` at most, fewer while the mesh
says it is full.

A pipeline admits what its limits allow (`max_in_flight`, `max_inflight_mpx`, the work its
budget covers: proxy/engine/admission.py), often fewer than a batch sends: OCR takes three
scanned pages of 7 Mpx at once. Sent 32 at a time, 21 of 24 such pages failed after five 503s
each (2026-12-01). So the window closes to what the mesh had taken when it refused one
(additive increase, multiplicative decrease, as TCP's congestion window and Netflix's
concurrency limits do), opens by one a window's worth of answers, and a refusal while the
batch's own requests fill the mesh is the batch's doing, not the input's: it is sent again
once a slot frees, without spending one of the input's attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

FULL = frozenset({429, 503})
"""A mesh that has no room now (the REST status; the gRPC door's are mapped to these)."""


class Window:
    def __init__(self, most: int) -> None:
        self.most = most
        self.limit = float(most)
        """Requests in flight allowed now; a float, so that it opens by 1/limit an answer."""
        self.in_flight = 0
        self.narrowest = most
        """The fewest it was closed to (told at the end of a run)."""
        self._room = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Room for one request, for as long as it is in flight."""
        async with self._room:
            await self._room.wait_for(lambda: self.in_flight < int(self.limit))
            self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1  # before any wait: counted even when cancelled
            async with self._room:
                self._room.notify(max(1, int(self.limit) - self.in_flight))

    def answered(self) -> None:
        """An answer (any but FULL): one slot more per window's worth."""
        if self.limit < self.most:  # the room it makes is handed out at the next release
            self.limit = min(float(self.most), self.limit + 1.0 / self.limit)

    def refused(self) -> bool:
        """The mesh had no room for a request that just left its slot: the window closes to
        the requests it still has in flight (what the mesh had taken, were it the only
        client). True when some were: the batch crowded the mesh itself."""
        crowded = self.in_flight > 0
        self.limit = max(1.0, min(self.limit, float(self.in_flight)))
        self.narrowest = min(self.narrowest, int(self.limit))
        return crowded
