"""Looking an answer up, and computing it once.

- In process, the lookup is instant: it happens before the run.
- In Redis, it happens beside the run: the run starts at once and is cancelled if the lookup
  hits first, so a slow or dead cache never adds latency (a failed lookup is counted and
  the run's answer used).
- Single flight: identical requests in flight together share one computation; each keeps its
  own deadline and cancellation, and the computation is cancelled only when nobody waits for
  it. A shared computation that fails for a reason of the request (4xx) fails its waiters
  alike; any other failure (a deadline, a service down) lets each waiter run on its own.
- Only complete answers are stored (a partial one, or an error, never), in the background
  when the store is remote.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from proxy import metrics
from proxy.engine.cache.entries import Stored, pack, unpack
from proxy.engine.cache.stores import Store, StoreError
from proxy.errors import Problem, StepError

log = logging.getLogger("proxy")

T = TypeVar("T")


@dataclass
class Flight(Generic[T]):
    task: asyncio.Task[tuple[T, str]]
    waiters: int = 0


@dataclass
class Answers(Generic[T]):
    """The entries of one pipeline (`step` empty) or one step, in `store`. `to_entry` says
    what of a computed value is kept (None: nothing, e.g. a partial answer); `from_entry`
    makes a value of a stored entry."""

    pipeline: str
    step: str
    store: Store
    ttl_s: float
    to_entry: Callable[[T], Stored | None]
    from_entry: Callable[[Stored], T]
    _flights: dict[bytes, Flight[T]] = field(default_factory=dict)
    _writes: set[asyncio.Task[None]] = field(default_factory=set)

    def _count(self, result: str) -> None:
        metrics.CACHE_LOOKUPS.labels(self.pipeline, self.step, result).inc()

    async def answer(
        self, key: bytes, compute: Callable[[], Awaitable[T]], deadline: float
    ) -> tuple[T, str]:
        """The value for `key` and how it came: `hit` (stored, or shared with an identical
        request in flight) or `miss` (computed here). `deadline`: this caller's (loop time)."""
        flight = self._flights.get(key)
        leader = flight is None
        if flight is None:
            task = asyncio.ensure_future(self._lookup_or_compute(key, compute))
            flight = self._flights[key] = Flight(task)
            task.add_done_callback(lambda _: self._landed(key, flight))
        flight.waiters += 1
        try:
            remaining = deadline - asyncio.get_running_loop().time()
            async with asyncio.timeout(max(remaining, 0)):
                value, how = await asyncio.shield(flight.task)
        except TimeoutError:
            raise Problem(504, "the request's budget ran out waiting for its answer") from None
        except (StepError, Problem) as exc:
            if leader or _status(exc) < 500:
                raise  # the leader's own failure, or one of the request itself: shared
            return await compute(), "miss"  # a deadline, a service down: tried on its own
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                flight.task.cancel()  # nobody waits for it any more
        return value, how if leader else "hit"

    def _landed(self, key: bytes, flight: Flight[T]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if flight.task.cancelled():
            return
        flight.task.exception()  # retrieved: a waiter re-raised it already

    async def _lookup_or_compute(
        self, key: bytes, compute: Callable[[], Awaitable[T]]
    ) -> tuple[T, str]:
        if self.store.local:
            found = await self._lookup(key)
            if found is not None:
                return found, "hit"
            value = await compute()
            await self._write(key, value)
            return value, "miss"
        lookup = asyncio.ensure_future(self._lookup(key))
        running = asyncio.ensure_future(compute())
        try:
            done, _ = await asyncio.wait({lookup, running}, return_when=asyncio.FIRST_COMPLETED)
            if lookup in done and lookup.result() is not None:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
                return lookup.result(), "hit"  # type: ignore[return-value]
            value = await running
            task = asyncio.ensure_future(self._write(key, value))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)
            return value, "miss"
        finally:
            for task in (lookup, running):
                if not task.done():
                    task.cancel()

    async def _lookup(self, key: bytes) -> T | None:
        try:
            blob = await self.store.get(key)
        except StoreError as exc:
            self._count("error")
            log.warning("cache lookup failed", extra={"fields": {"error": str(exc)}})
            return None
        if blob is None:
            self._count("miss")
            return None
        try:
            value = self.from_entry(unpack(blob))
        except ValueError:
            self._count("error")  # a damaged or foreign value: as good as none
            return None
        self._count("hit")
        return value

    async def _write(self, key: bytes, value: T) -> None:
        try:
            entry = self.to_entry(value)
            if entry is None:
                return
            blob = pack(entry)
            await self.store.put(key, blob, self.ttl_s)
        except Exception as exc:  # a cache that cannot keep an answer never fails it
            self._count("error")
            log.warning("cache write failed", extra={"fields": {"error": repr(exc)}})
            return
        metrics.CACHE_STORED_BYTES.labels(self.pipeline, self.step).inc(len(blob))


def _status(exc: StepError | Problem) -> int:
    return exc.http_status if isinstance(exc, StepError) else exc.status
