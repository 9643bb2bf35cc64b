"""Where cache entries live: in process (an LRU bounded in bytes, the default) or in Redis
(shared by proxy replicas). Keys are bytes; values are entries as each store keeps them
(entries.py: tuples in process, packed bytes in Redis).

A store that fails raises StoreError; the caller counts it and goes on without the cache,
so a dead or slow Redis is never an error for a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from proxy import metrics
from proxy.engine.cache.doorkeeper import SharedDoorkeeper

T = TypeVar("T")
log = logging.getLogger("proxy")


class StoreError(Exception):
    """The store could not answer (down, slow, refused)."""


class Store(Protocol):
    local: bool
    """Answers without waiting: looked up before a run, not beside it."""

    async def get(self, key: bytes) -> bytes | None: ...

    async def put(self, key: bytes, value: bytes, ttl_s: float) -> None: ...

    async def clear(self, prefix: bytes) -> int: ...

    async def close(self) -> None: ...

    def skipping(self) -> bool:
        """Failing lately: calls now would fail at once (the caller may spare itself them)."""
        ...


class MemoryStore:
    """An LRU bounded in bytes, each entry with its own expiry. Every operation is O(1):
    a flood of unique entries only evicts the least recently used ones. Values are whatever
    the caller keeps, counted as the size it gives (`put_now`), or bytes (`put`); they
    should be untracked by the garbage collector (entries.keep), however many there are."""

    local = True

    def __init__(self, max_bytes: int, name: str) -> None:
        self.max_bytes = max_bytes
        self.name = name
        self.bytes = 0
        self._entries: OrderedDict[bytes, object] = OrderedDict()
        self._held: dict[bytes, tuple[int, float]] = {}
        """Each entry's size and expiry, apart from its value: a young garbage collection
        stops tracking a tuple of numbers whatever its order, one holding the value only if
        the value was stopped first (its records piled up in the old generations, walked by
        every full pass)."""
        self._gauge = metrics.CACHE_BYTES.labels(name)
        self._evictions = metrics.CACHE_EVICTIONS.labels(name)

    async def get(self, key: bytes) -> bytes | None:
        return self.get_now(key)  # type: ignore[return-value]  # bytes when put as bytes

    def get_now(self, key: bytes) -> object | None:
        value = self._entries.get(key)
        if value is None:
            return None
        if time.monotonic() >= self._held[key][1]:
            self._drop(key)
            self._gauge.set(self.bytes)
            return None
        self._entries.move_to_end(key)
        return value

    async def put(self, key: bytes, value: bytes, ttl_s: float) -> None:
        self.put_now(key, value, len(value), ttl_s)

    def put_now(self, key: bytes, value: object, size: int, ttl_s: float) -> None:
        if size > self.max_bytes:
            return  # larger than the whole cache: never kept
        if key in self._entries:
            self._drop(key)
        self._entries[key] = value
        self._held[key] = (size, time.monotonic() + ttl_s)
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self._evictions.inc()
        self._gauge.set(self.bytes)

    def _drop(self, key: bytes) -> None:
        del self._entries[key]
        self.bytes -= self._held.pop(key)[0]

    async def clear(self, prefix: bytes) -> int:
        doomed = [k for k in self._entries if k.startswith(prefix)]
        for key in doomed:
            self._drop(key)
        self._gauge.set(self.bytes)
        return len(doomed)

    async def close(self) -> None:
        self._entries.clear()
        self._held.clear()
        self.bytes = 0

    def skipping(self) -> bool:
        return False


TRIP_AFTER = 3
"""Redis calls failed in a row after which the cache skips Redis for a while."""
SKIP_S = 1.0
"""How long. A Redis refusing connections cost every request four attempts and two log
lines: digits at c=32 ran 0.35-0.46x its rate with the cache off, the proxy's CPU a request
3.3x, 1.1 KB of log a request."""
WARN_EVERY_S = 30.0
"""A Redis that stays down is said again at most this often."""

GET_SEEN = """
-- KEYS: the entry; a doorkeeper's bits now, before, and its count of keys added now.
-- ARGV: the key's two bit positions; the keys a generation holds.
-- Returns {entry or nil, 1 if the key was seen lately (or is stored), else 0}; a key not
-- seen is remembered (doorkeeper.py's Doorkeeper.admits, in Redis).
local value = redis.call('GET', KEYS[1])
if value then return {value, 1} end
local a, b = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 2, 3 do
  if redis.call('GETBIT', KEYS[i], a) == 1 and redis.call('GETBIT', KEYS[i], b) == 1 then
    return {false, 1}
  end
end
redis.call('SETBIT', KEYS[2], a, 1)
redis.call('SETBIT', KEYS[2], b, 1)
if redis.call('INCR', KEYS[4]) >= tonumber(ARGV[3]) then
  redis.call('RENAME', KEYS[2], KEYS[3])
  redis.call('DEL', KEYS[4])
end
return {false, 0}
"""


class RedisStore:
    """Entries in Redis (its own memory bound and eviction: `maxmemory` with an LRU policy),
    each with its TTL. Every call is bounded by `timeout_s`."""

    local = False

    def __init__(self, url: str, timeout_s: float) -> None:
        # Only when a Redis cache is configured.
        from redis.exceptions import RedisError, ResponseError

        from proxy.engine import redis_client

        self._errors = (RedisError, OSError, TimeoutError)
        self._refused = ResponseError
        """What Redis answers a command it will not run (an error reply, not a failure)."""
        self.timeout_s = timeout_s
        # One retry: a connection Redis closed (a restart) costs one round trip, not a miss.
        self._redis = redis_client.connect(url, timeout_s, retries=1, backoff=False)
        self._get_seen = self._redis.register_script(GET_SEEN)
        self._failures = 0
        """Calls failed in a row."""
        self._skip_until = 0.0
        self._why = ""
        self._warned = -WARN_EVERY_S

    def skipping(self) -> bool:
        return bool(self._skip_until) and time.monotonic() < self._skip_until

    async def _call(self, work: Callable[[], Awaitable[T]]) -> T:
        if self.skipping():
            raise StoreError(self._why)
        try:
            async with asyncio.timeout(self.timeout_s):
                out = await work()
        except self._refused as exc:
            # An error reply: Redis answers (a write refused when full under `noeviction`,
            # or by a replica), so the lookups still go to it.
            raise _failed(exc) from None
        except self._errors as exc:
            raise self._note_failure(exc) from None
        if self._failures:
            if self._skip_until:
                log.warning("cache: redis answers again")
            self._failures, self._skip_until = 0, 0.0
        return out

    def _note_failure(self, exc: BaseException) -> StoreError:
        """A failed call; after TRIP_AFTER in a row, calls are skipped for SKIP_S."""
        error = _failed(exc)
        self._failures += 1
        if self._failures >= TRIP_AFTER:
            now = time.monotonic()
            self._skip_until = now + SKIP_S
            self._why = f"{error} (skipped for {SKIP_S:g} s after {self._failures} failures)"
            if now - self._warned >= WARN_EVERY_S:
                self._warned = now
                log.warning("cache: " + self._why)
        return error

    async def get(self, key: bytes) -> bytes | None:
        return await self._call(lambda: self._redis.get(key))

    async def get_seen(self, key: bytes, doorkeeper: SharedDoorkeeper) -> tuple[bytes | None, bool]:
        """The entry for `key`, and whether `doorkeeper` has seen the key lately (it
        remembers it if not), in one call."""
        a, b = doorkeeper.positions(key)
        keys = [key, *doorkeeper.names]

        async def lookup() -> list:
            try:
                return await self._get_seen(keys=keys, args=[a, b, doorkeeper.keys])
            except self._refused:
                # Redis refuses writes (full under `noeviction`, or a replica): the entry is
                # still looked up, the key not remembered (hits served, nothing admitted).
                return [await self._redis.get(key), 0]

        value, seen = await self._call(lookup)
        return value, bool(seen)

    async def put(self, key: bytes, value: bytes, ttl_s: float) -> None:
        px = max(1, int(ttl_s * 1000))
        await self._call(lambda: self._redis.set(key, value, px=px))

    async def clear(self, prefix: bytes) -> int:
        async def sweep() -> int:
            count = 0
            async for key in self._redis.scan_iter(match=prefix + b"*", count=500):
                count += await self._redis.unlink(key)
            return count

        try:
            return await sweep()
        except self._errors as exc:
            raise _failed(exc) from None

    async def close(self) -> None:
        await self._redis.aclose()


def _failed(exc: BaseException) -> StoreError:
    from proxy.engine.redis_client import described  # loaded already: the store's client

    return StoreError(f"redis: {described(exc)}")
