"""Submissions arriving together, stored together: one trip to the store for all of them (a
group commit). Both backends use it: SQLite writes the group in one transaction (enqueue at
c=32 went from 1.9k/s to 4.8k/s), Redis runs the group as one SUBMIT call (`cut` in parts
of bounded uploads)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")


class Grouped(Generic[Item, Outcome]):
    """`await grouped(item)`: the item's outcome from `store(group)`, which stores a group of
    items and returns one outcome (or the exception it ends with) per item, in order. While
    one group is stored the next gathers. A caller that leaves does not take its item back:
    what it submitted is stored all the same."""

    def __init__(self, store: Callable[[list[Item]], Awaitable[list[Outcome | Exception]]]):
        self._store = store
        self._waiting: list[tuple[Item, asyncio.Future[Outcome]]] = []
        self._storing: asyncio.Task[None] | None = None

    async def __call__(self, item: Item) -> Outcome:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._storing is None or self._storing.done():
            self._storing = asyncio.create_task(self._drain())
        return await future

    async def settle(self) -> None:
        """Until the groups gathered so far are stored (their callers may have left: what
        they submitted is stored all the same), before the store closes."""
        if self._storing is not None:
            await asyncio.gather(self._storing, return_exceptions=True)

    async def _drain(self) -> None:
        while self._waiting:
            group, self._waiting = self._waiting, []
            try:
                outcomes = await self._store([item for item, _ in group])
            except BaseException as exc:  # the store failed: every one of them did
                for _, future in group:
                    if not future.done():
                        future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (_, future), outcome in zip(group, outcomes, strict=True):
                if future.done():  # its caller left
                    continue
                if isinstance(outcome, Exception):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)


def cut(items: Sequence[Item], size: Callable[[Item], int], most: int) -> list[list[Item]]:
    """`items` in order, in parts of at most `most` in `size` each (an item larger alone)."""
    parts: list[list[Item]] = [[]]
    total = 0
    for item in items:
        weight = size(item)
        if parts[-1] and total + weight > most:
            parts.append([])
            total = 0
        parts[-1].append(item)
        total += weight
    return parts
