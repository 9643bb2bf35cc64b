"""A queue with one reader: items put from callbacks and tasks, taken in order by one task.

Both ends of a stream have one: the proxy's stream writer (proxy/transport/streams.py) and a
service's stream answers (v2server/servicer.py). An asyncio.Queue costs ~10 Python calls a
message more (its put wakes a getter through a deque of waiters, its get re-checks in a
loop), and every message of a stream goes through one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Mailbox(Generic[T]):
    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._more: asyncio.Future[None] | None = None
        """What the reader waits on while there is nothing to take."""

    def __bool__(self) -> bool:
        return bool(self._items)

    def put_nowait(self, item: T) -> None:
        self._items.append(item)
        more, self._more = self._more, None
        if more is not None and not more.done():  # done: its reader was cancelled
            more.set_result(None)

    async def get(self) -> T:
        """The oldest item, waiting for one (only one task may wait at a time)."""
        while not self._items:
            self._more = asyncio.get_running_loop().create_future()
            await self._more
        return self._items.popleft()
