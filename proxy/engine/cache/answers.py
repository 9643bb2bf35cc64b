"""Looking an answer up, and computing it once.

- In process, the lookup is instant: it happens before the run.
- In Redis, it happens beside the run: the run starts at once and is cancelled if the lookup
  hits first, so a slow or dead cache never adds latency (a failed lookup is counted and
  the run's answer used).
- Single flight: identical requests in flight together share one computation, run by the
  first of them; the others wait for it, each within its own budget and cancelled on its own.
  If the first one's computation fails for a reason of the request (4xx), its waiters get the
  same answer; if it fails otherwise (a deadline, a service down) or its client leaves, each
  waiter runs on its own.
- Only complete answers are stored (a partial one, or an error, never), in the background
  when the store is remote; with a doorkeeper (`admit: second`), only once their key is
  seen again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from proxy import metrics
from proxy.engine.cache.doorkeeper import Doorkeeper, SharedDoorkeeper
from proxy.engine.cache.entries import Stored, keep, kept, pack, unpack
from proxy.engine.cache.stores import Store, StoreError
from proxy.errors import Problem, StepError

log = logging.getLogger("proxy")

T = TypeVar("T")
S = TypeVar("S")


@dataclass(slots=True)
class Flight(Generic[T]):
    """A value being computed for a key, by the request that looked it up first."""

    answer: asyncio.Future[T] | None = None
    """Made by the first identical request to wait for it (most flights have none)."""
    waiters: int = 0
    """Identical requests waiting for it."""


@dataclass
class Answers(Generic[T]):
    """The entries of one pipeline (`step` empty) or one step, in `store`. `to_entry` says
    what of a computed value is kept (None: nothing, e.g. a partial answer); `from_entry`
    makes a value of a stored entry; `doorkeeper`, when set, admits a value only on its
    key's second sighting (in this process, or in Redis with the entries)."""

    pipeline: str
    step: str
    store: Store
    ttl_s: float
    to_entry: Callable[[T], Stored | None]
    from_entry: Callable[[Stored], T]
    doorkeeper: Doorkeeper | SharedDoorkeeper | None = None
    _flights: dict[bytes, Flight[T]] = field(default_factory=dict)
    _writes: set[asyncio.Task[None]] = field(default_factory=set)
    _settled: bool = False

    def __post_init__(self) -> None:
        # Bound once: a labels() lookup per request is a measurable share of a hit's cost.
        self._hits, self._misses, self._errors = (
            metrics.CACHE_LOOKUPS.labels(self.pipeline, self.step, result)
            for result in ("hit", "miss", "error")
        )
        self._stored = metrics.CACHE_STORED_BYTES.labels(self.pipeline, self.step)
        self._unadmitted = metrics.CACHE_UNADMITTED.labels(self.pipeline, self.step)

    def hit_now(self, key: bytes) -> T | None:
        """The value kept in process for `key`, found without waiting (no task, no turn of
        the loop: a hit's door answers at once). None: nothing kept, or being computed, or
        a remote store; `answer(key, ..., looked_up=True)` then, which counts the miss."""
        if not self.store.local or key in self._flights:
            return None
        stored = self.store.get_now(key)  # type: ignore[attr-defined]
        return None if stored is None else self._found(stored, kept)

    async def answer(
        self,
        key: bytes,
        compute: Callable[[], Awaitable[T]],
        deadline: float,
        looked_up: bool = False,
    ) -> tuple[T, str]:
        """The value for `key` and how it came: `hit` (stored, or shared with an identical
        request in flight) or `miss` (computed here). `deadline`: this caller's (loop time).
        `looked_up`: `hit_now` found nothing kept for it just before."""
        flight = self._flights.get(key)
        if flight is not None:
            return await self._follow(flight, compute, deadline)
        if self.store.local:  # in process: no await, no task on a hit
            stored = None if looked_up else self.store.get_now(key)  # type: ignore[attr-defined]
            if stored is None:
                self._misses.inc()  # `_found`'s count, without its call
            elif (found := self._found(stored, kept)) is not None:
                return found, "hit"
        flight = self._flights[key] = Flight()
        try:
            if self.store.local:
                value = await compute()
                self._keep(key, value)
                how = "miss"
            else:
                value, how = await self._race(key, compute)
        except BaseException as exc:
            if flight.answer is not None:
                if flight.waiters and not isinstance(exc, asyncio.CancelledError):
                    flight.answer.set_exception(exc)
                else:
                    flight.answer.cancel()  # the waiters each run on their own
            raise
        else:
            if flight.answer is not None:
                flight.answer.set_result(value)
            return value, how
        finally:
            del self._flights[key]

    async def _follow(
        self, flight: Flight[T], compute: Callable[[], Awaitable[T]], deadline: float
    ) -> tuple[T, str]:
        """Wait, within this caller's own budget, for an identical request's value."""
        if flight.answer is None:
            flight.answer = asyncio.get_running_loop().create_future()
            flight.answer.add_done_callback(_retrieved)
        answer = flight.answer
        flight.waiters += 1
        try:
            remaining = deadline - asyncio.get_running_loop().time()
            async with asyncio.timeout(max(remaining, 0)):
                return await asyncio.shield(answer), "hit"
        except TimeoutError:
            raise Problem(504, "the request's budget ran out waiting for its answer") from None
        except asyncio.CancelledError:
            if not answer.cancelled():
                raise  # this caller was cancelled, not the value
        except (StepError, Problem) as exc:
            if _status(exc) < 500:
                raise  # a failure of the request itself: the same for every copy of it
        finally:
            flight.waiters -= 1
        # The request computing it left, or failed for a reason not its own (a deadline, a
        # service down): this one runs on its own.
        return await compute(), "miss"

    async def _race(self, key: bytes, compute: Callable[[], Awaitable[T]]) -> tuple[T, str]:
        """The remote lookup beside the run: a hit cancels the run; a miss, or a store that
        fails or is slow, leaves the run's value (stored in the background)."""
        if self.store.skipping():  # failing lately: neither looked up nor stored
            self._errors.inc()
            return await compute(), "miss"
        lookup = asyncio.ensure_future(self._lookup(key))
        running = asyncio.ensure_future(compute())
        handed = False
        try:
            done, _ = await asyncio.wait({lookup, running}, return_when=asyncio.FIRST_COMPLETED)
            if lookup in done and lookup.result()[0] is not None:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
                return lookup.result()[0], "hit"  # type: ignore[return-value]
            value = await running
            handed = self._write_later(key, value, lookup)
            return value, "miss"
        finally:
            for task in (running,) if handed else (lookup, running):
                if not task.done():
                    task.cancel()

    async def _lookup(self, key: bytes) -> tuple[T | None, bool]:
        """The stored value (None: none, or the store failed), and whether the shared
        doorkeeper had seen the key (False without one)."""
        seen = False
        try:
            if isinstance(self.doorkeeper, SharedDoorkeeper):
                blob, seen = await self.store.get_seen(key, self.doorkeeper)  # type: ignore[attr-defined]
            else:
                blob = await self.store.get(key)
        except StoreError:  # counted; the store says when it fails and when it is back
            self._errors.inc()
            return None, False
        return self._found(blob, unpack), seen

    def _write_later(self, key: bytes, value: T, lookup: asyncio.Future) -> bool:
        """Store a computed value in the background if it is kept and admitted; True when
        the lookup is handed over (the shared doorkeeper's answer comes with it, maybe still
        on its way)."""
        entry = self._entry(value)
        if entry is None:
            return False
        if isinstance(self.doorkeeper, SharedDoorkeeper):
            self._background(self._write_if_seen(key, entry, lookup))
            return True
        if self._admits(key):
            self._background(self._write(key, entry))
        return False

    def _background(self, work: Coroutine[None, None, None]) -> None:
        if self._settled:  # the proxy is stopping: its store is closed or about to be
            work.close()
            return
        task = asyncio.ensure_future(work)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def settle(self, timeout_s: float) -> None:
        """Let the writes under way finish (each is bounded by the store's timeout; any left
        after `timeout_s` are cancelled) and start no more: the proxy is stopping. An answer
        computed before a rolling restart is then kept, and no write opens a connection to
        a store already closed (one that did was never closed: a leaked socket)."""
        self._settled = True
        if not self._writes:
            return
        _, late = await asyncio.wait(set(self._writes), timeout=timeout_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _write_if_seen(self, key: bytes, entry: Stored, lookup: asyncio.Future) -> None:
        if (await lookup)[1]:  # bounded by the store's timeout; a failed lookup: not seen
            await self._write(key, entry)
        else:
            self._unadmitted.inc()

    def _found(self, stored: S | None, read: Callable[[S], Stored]) -> T | None:
        """The value of what the store answered (None: nothing); `read` makes it an entry."""
        if stored is None:
            self._misses.inc()
            return None
        try:
            value = self.from_entry(read(stored))
        except ValueError:
            self._errors.inc()  # a damaged or foreign value: as good as none
            return None
        self._hits.inc()
        return value

    def _admits(self, key: bytes) -> bool:
        """The value computed for `key` may be stored (this process's doorkeeper has seen
        the key)."""
        if not isinstance(self.doorkeeper, Doorkeeper) or self.doorkeeper.admits(key):
            return True
        self._unadmitted.inc()
        return False

    def _entry(self, value: T) -> Stored | None:
        """What of `value` is kept (None: nothing, e.g. a partial answer), asked before the
        doorkeeper, so that only what would be kept is counted as refused."""
        try:
            return self.to_entry(value)
        except Exception as exc:  # a cache that cannot keep an answer never fails it
            self._failed(exc)
            return None

    def _keep(self, key: bytes, value: T) -> None:
        """Store `value` in process, no await (`_entry`, `_admits` inlined: frames count)."""
        try:
            entry = self.to_entry(value)
            if entry is None:
                return
            if isinstance(self.doorkeeper, Doorkeeper) and not self.doorkeeper.admits(key):
                self._unadmitted.inc()
                return
            tuples, size = keep(entry)
            self.store.put_now(key, tuples, size, self.ttl_s)  # type: ignore[attr-defined]
        except Exception as exc:
            self._failed(exc)
            return
        self._stored.inc(size)

    async def _write(self, key: bytes, entry: Stored) -> None:
        """Store `entry` in Redis (in the background of the request)."""
        try:
            blob = pack(entry)
            await self.store.put(key, blob, self.ttl_s)
        except StoreError:
            self._errors.inc()
            return
        except Exception as exc:
            self._failed(exc)
            return
        self._stored.inc(len(blob))

    def _failed(self, exc: Exception) -> None:
        self._errors.inc()
        log.warning("cache write failed", extra={"fields": {"error": repr(exc)}})


def _retrieved(future: asyncio.Future) -> None:
    """A failure no waiter was left to read is not a 'never retrieved' warning."""
    if not future.cancelled():
        future.exception()


def _status(exc: StepError | Problem) -> int:
    return exc.http_status if isinstance(exc, StepError) else exc.status
