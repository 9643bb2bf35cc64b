"""The models' fingerprints a cache key covers (their versions, platform and tensors, from
each service's metadata, from the proxy's one catalog of them: transport/catalog.py), and
the keys' bases made of them (cache/keys.py)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence

from proxy.transport.catalog import Catalog
from proxy.transport.target import Target


class Base:
    """The digest of everything of a key but the request, while its models' fingerprints
    are fresh: until then a key reads one clock, not every model's fingerprint."""

    __slots__ = ("digest", "fingerprints", "until")

    def __init__(self, digest: hashlib._Hash, fingerprints: tuple[bytes, ...]) -> None:
        self.digest, self.fingerprints, self.until = digest, fingerprints, float("-inf")


class Fingerprints:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.bases: dict[object, Base] = {}
        """A plan, or a step's (target, outputs) -> its keys' base (`_key`)."""

    async def of(self, target: Target) -> bytes | None:
        """The model's fingerprint; None while its service cannot say (nothing cached)."""
        described = await self.catalog.of(target.address, target.model, target.version)
        return None if described is None else described.fingerprint

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
        return min(
            (self.catalog.until(t.address, t.model, t.version) for t in targets),
            default=float("inf"),
        )

    def now(self, target: Target) -> bytes | None:
        described = self.catalog.now(target.address, target.model, target.version)
        return None if described is None else described.fingerprint
