"""A bound on the bytes of requests held at once, where counting messages is not enough.

A ModelStreamInfer stream may have 128 requests running or unsent; 40 large ones written
without reading the answers made a service hold ~2 GB. Each stream therefore also has a
window in bytes, and the whole service one more: while it is full, neither a stream nor a
unary call is read (gRPC's flow control holds the sender back; v2server/servicer.py,
ModelInferRead).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class ByteWindow:
    """At most `limit` bytes held; a request larger than the limit may pass alone.

    Bytes that fit are taken at once; when bytes are given back, the waiters whose bytes now
    fit are served in arrival order. No lock: in one event loop taking and giving never
    interleave, and an asyncio.Condition's lock and wake-ups were paid on every message of a
    stream where nothing waited (bench/README, 2026-11-27, evening)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

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
        if self.fits(nbytes):
            self.used += nbytes
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (nbytes, granted)
        self._waiters.append(entry)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.give(nbytes)  # granted as the waiter was cancelled: not held after all
            else:
                with contextlib.suppress(ValueError):  # gone if a give came first
                    self._waiters.remove(entry)
            raise

    def resize(self, held: int, nbytes: int) -> None:
        """Hold `nbytes` in place of `held` (a reservation that turned out smaller or
        larger), whether or not they fit."""
        self.used += nbytes - held
        if nbytes < held and self._waiters:
            self._grant()

    def give(self, nbytes: int) -> None:
        self.used -= nbytes
        if self._waiters:
            self._grant()

    def _grant(self) -> None:
        """Hold the bytes of every waiter that fits now, in arrival order, and wake it."""
        waiting: deque[tuple[int, asyncio.Future[None]]] = deque()
        for nbytes, granted in self._waiters:
            if granted.done():  # cancelled, its task not yet resumed
                continue
            if self.fits(nbytes):
                self.used += nbytes
                granted.set_result(None)
            else:
                waiting.append((nbytes, granted))
        self._waiters = waiting
