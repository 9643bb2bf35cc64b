"""The batcher's queue: requests waiting for an execution, oldest first, bounded."""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field

import numpy as np

from protos.errors import DeadlineExceeded
from v2server import batchmetrics
from v2server.spans import Timing


@dataclass(eq=False)
class Pending:
    inputs: dict[str, np.ndarray]
    rows: int
    deadline: float | None
    future: asyncio.Future[dict[str, np.ndarray]]
    arrived_ns: int = field(default_factory=time.perf_counter_ns)
    timing: Timing | None = None
    """Filled for the request's spans when traces are on (v2server/spans.py)."""
    signature: tuple = field(init=False)
    """Requests merge only with others of the same per-row shapes and types."""

    def __post_init__(self) -> None:
        self.signature = tuple(
            (name, arr.dtype.str, arr.shape[1:]) for name, arr in sorted(self.inputs.items())
        )


def fail(pending: list[Pending], exc: Exception) -> None:
    """Answer every caller still waiting with `exc`."""
    for p in pending:
        if not p.future.done():
            p.future.set_exception(exc)


class RequestQueue:
    def __init__(self, name: str) -> None:
        self.name = name
        self._items: collections.deque[Pending] = collections.deque()
        self._arrived = asyncio.Event()
        self._depth = batchmetrics.QUEUE_DEPTH.labels(name)

    def __len__(self) -> int:
        return len(self._items)

    def show_depth(self, extra: int = 0) -> None:
        self._depth.set(len(self._items) + extra)

    def push(self, pending: Pending) -> None:
        self._items.append(pending)
        self.show_depth()
        self._arrived.set()

    def drain(self) -> list[Pending]:
        items = list(self._items)
        self._items.clear()
        self.show_depth()
        return items

    def alive(self, pending: Pending, loop: asyncio.AbstractEventLoop) -> bool:
        """The caller is still waiting and in time (a late one is answered here)."""
        if pending.future.done():  # caller cancelled
            return False
        if pending.deadline is not None and pending.deadline <= loop.time():
            pending.future.set_exception(
                DeadlineExceeded(f"model '{self.name}': deadline passed while queued")
            )
            return False
        return True

    async def next_live(self, loop: asyncio.AbstractEventLoop) -> Pending:
        """The oldest queued request whose caller is still waiting and in time."""
        while True:
            while not self._items:
                self._arrived.clear()
                await self._arrived.wait()
            pending = self._items.popleft()
            self.show_depth()
            if self.alive(pending, loop):
                return pending

    async def wait_arrival(self, timeout: float) -> bool:
        """False when nothing arrived within `timeout` seconds."""
        self._arrived.clear()
        try:
            await asyncio.wait_for(self._arrived.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def take_compatible(
        self, batch: list[Pending], rows: int, max_rows: int, loop: asyncio.AbstractEventLoop
    ) -> int:
        """Move queued requests that fit the batch into it; return the new row count."""
        signature = batch[0].signature
        kept: collections.deque[Pending] = collections.deque()
        while self._items and rows < max_rows:
            pending = self._items.popleft()
            if not self.alive(pending, loop):
                continue
            if pending.signature == signature and rows + pending.rows <= max_rows:
                batch.append(pending)
                rows += pending.rows
            else:
                kept.append(pending)
        self._items.extendleft(reversed(kept))
        self.show_depth()
        return rows
