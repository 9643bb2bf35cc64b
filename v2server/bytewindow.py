"""A bound on the bytes of requests held at once, where counting messages is not enough.

A ModelStreamInfer stream may have 128 requests running or unsent; 40 large ones written
without reading the answers made a service hold ~2 GB. Each stream therefore also has a
window in bytes, and the whole service one more: while it is full, a stream is not read
(gRPC's flow control holds its sender back) and a unary request is refused at once with
RESOURCE_EXHAUSTED (its bytes have arrived already; its outputs have not been made).
"""

from __future__ import annotations

import asyncio


class ByteWindow:
    """At most `limit` bytes held; a request larger than the limit may pass alone."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._changed = asyncio.Condition()

    def fits(self, nbytes: int) -> bool:
        return self.used == 0 or self.used + nbytes <= self.limit

    def take(self, nbytes: int) -> bool:
        """Hold `nbytes` if they fit now; False otherwise."""
        if not self.fits(nbytes):
            return False
        self.used += nbytes
        return True

    async def wait_take(self, nbytes: int) -> None:
        """Hold `nbytes`, waiting until they fit."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.fits(nbytes))
            self.used += nbytes

    async def give(self, nbytes: int) -> None:
        async with self._changed:
            self.used -= nbytes
            self._changed.notify_all()
