"""The models' fingerprints a cache key covers (their versions, platform and tensors, from
each service's metadata), asked at most once per `check_s` per model, and the keys' bases
made of them (cache/keys.py)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence

from proxy.transport.fresh import Fresh
from proxy.transport.services import Services
from proxy.transport.target import Target


class Base:
    """The digest of everything of a key but the request, while its models' fingerprints
    are fresh: until then a key reads one clock, not every model's fingerprint."""

    __slots__ = ("digest", "fingerprints", "until")

    def __init__(self, digest: hashlib._Hash, fingerprints: tuple[bytes, ...]) -> None:
        self.digest, self.fingerprints, self.until = digest, fingerprints, float("-inf")


class Fingerprints:
    def __init__(self, services: Services, check_s: float, timeout_s: float) -> None:
        self.services = services
        self.check_s = check_s
        self.timeout_s = timeout_s
        self._fresh: dict[tuple[str, str, str], Fresh[bytes | None]] = {}
        self._unknown: dict[tuple[str, str, str], float] = {}
        """Models whose last ask got no fingerprint -> when they were last asked."""
        self.bases: dict[object, Base] = {}
        """A plan, or a step's (target, outputs) -> its keys' base (`_key`)."""

    async def of(self, target: Target) -> bytes | None:
        key = (target.address, target.model, target.version)
        fresh = self._fresh.get(key)
        if fresh is None:
            fresh = self._fresh[key] = Fresh(lambda: self._ask(*key), self.check_s)
        asked = self._unknown.get(key)
        if asked is None:
            return await fresh.get()
        # It could not say when last asked (unreachable, frozen, unknown model): asked again
        # once per check_s, but no request waits for it. Each request waited up to
        # timeout_s before (0.5 s a `digits-partial` request while one branch was frozen).
        now = time.monotonic()
        if now - asked >= self.check_s:
            self._unknown[key] = now
            task = asyncio.ensure_future(fresh.get())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return fresh.peek()

    async def _ask(self, address: str, model: str, version: str) -> bytes | None:
        key = (address, model, version)
        try:
            meta = await self.services.metadata(address, model, version, self.timeout_s)
        except Exception:  # unreachable, unknown model: no fingerprint, no caching
            self._unknown.setdefault(key, time.monotonic())
            return None
        self._unknown.pop(key, None)
        return meta.SerializeToString(deterministic=True)

    async def of_all(self, targets: Sequence[Target]) -> tuple[bytes, ...] | None:
        known = [self.now(t) for t in targets]
        if any(p is None for p in known):  # some to ask again (once per check_s)
            known = await asyncio.gather(*(self.of(t) for t in targets))
        return None if any(p is None for p in known) else tuple(known)  # type: ignore[arg-type]

    def all_now(self, targets: Sequence[Target]) -> tuple[bytes, ...] | None:
        """Every target's fingerprint if all are known and fresh, without waiting."""
        known = tuple(self.now(t) for t in targets)
        return None if None in known else known  # type: ignore[return-value]

    def fresh_until(self, targets: Sequence[Target]) -> float:
        """When the first of these targets' fingerprints goes stale (time.monotonic)."""
        until = float("inf")
        for t in targets:
            fresh = self._known(t)
            until = min(until, float("-inf") if fresh is None else fresh.until())
        return until

    def now(self, target: Target) -> bytes | None:
        fresh = self._known(target)
        return None if fresh is None else fresh.peek()

    def _known(self, target: Target) -> Fresh[bytes | None] | None:
        return self._fresh.get((target.address, target.model, target.version))
