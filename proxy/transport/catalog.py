"""Each model's metadata as its service declares it (v2 ModelMetadata), asked at most once per
`check_s` per model, and shared by all that read it: the caches' keys (a model's fingerprint),
the wiring check of a refused call, and the v2 door's check of a forwarded call.

So a model reloaded with other tensors, in a new version or replaced in place (its
configuration's digest of its files: predictors/repository.py), or another server put at the
same address, is seen by all three within `check_s`. Before there was one catalog, the door kept
a forwarded model's first answer until the proxy restarted: it refused calls a reloaded
model took.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from grpc import aio

from protos import pb
from proxy.transport.fresh import Fresh
from proxy.transport.services import Services
from proxy.transport.target import Target
from v2server.triton import DIGEST_PARAMETER

Key = tuple[str, str, str]
"""(address, model, version)."""


@dataclass(frozen=True, slots=True)
class Described:
    meta: pb.ModelMetadataResponse
    config: pb.ModelConfig | None
    """None where the server has no ModelConfig (Triton's extension, not the v2 core)."""
    fingerprint: bytes
    """Both serialised deterministically: what a cache key covers of the model. Our
    predictors report a digest of the files they loaded in the config's parameters, so a
    model replaced in place (the same version, other weights) changes it too."""


class Catalog:
    def __init__(self, services: Services, check_s: float, timeout_s: float) -> None:
        self.services = services
        self.check_s = check_s
        self.timeout_s = timeout_s
        # Wrapped in a tuple: Fresh takes None for "never asked", and a model that could not
        # say is an answer kept for check_s like any other.
        self._fresh: dict[Key, Fresh[tuple[Described | None]]] = {}
        self._unknown: dict[Key, float] = {}
        """Models whose last ask got no answer -> when they were last asked."""

    async def of(self, address: str, model: str, version: str = "") -> Described | None:
        """The model's metadata; asked when older than check_s (one ask shared by all who
        wait). None when the service could not say (unreachable, frozen, unknown model):
        such a model is asked again once per check_s, but no caller waits for it."""
        key = (address, model, version)
        fresh = self._entry(key)
        asked = self._unknown.get(key)
        if asked is None:
            return (await fresh.get())[0]
        # Each request waited up to timeout_s for a model that could not say before (0.5 s
        # a `digits-partial` request while one branch was frozen).
        now = time.monotonic()
        if now - asked >= self.check_s:
            self._unknown[key] = now
            task = asyncio.ensure_future(fresh.get())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return None

    def now(self, address: str, model: str, version: str = "") -> Described | None:
        """The model's metadata if known and younger than check_s, without waiting."""
        fresh = self._fresh.get((address, model, version))
        held = None if fresh is None else fresh.peek()
        return None if held is None else held[0]

    def last(self, address: str, model: str, version: str = "") -> Described | None:
        """The model's metadata as last known, however old, without waiting; asked again in
        the background when older than check_s (None: never known yet, asked now)."""
        held = self._entry((address, model, version)).last()
        return None if held is None else held[0]

    def digest(self, target: Target) -> str | None:
        """The SHA-256 of the model's files as its service reports it (`mesh.sha256` in its
        configuration's parameters: our predictors and recipes do), as last known; None:
        not reported, or not known yet (asked now, in the background)."""
        described = self.last(target.address, target.model, target.version)
        if described is None or described.config is None:
            return None
        parameter = described.config.parameters.get(DIGEST_PARAMETER)
        return None if parameter is None else parameter.string_value or None

    def _entry(self, key: Key) -> Fresh[tuple[Described | None]]:
        fresh = self._fresh.get(key)
        if fresh is None:
            fresh = self._fresh[key] = Fresh(lambda: self._ask(key), self.check_s)
        return fresh

    def until(self, address: str, model: str, version: str = "") -> float:
        """When the model's metadata goes stale (time.monotonic; -inf: not known now)."""
        fresh = self._fresh.get((address, model, version))
        if fresh is None or self.now(address, model, version) is None:
            return float("-inf")
        return fresh.until()

    async def _ask(self, key: Key) -> tuple[Described | None]:
        try:
            meta, config = await asyncio.gather(
                self.services.metadata(*key, self.timeout_s), self._config(key)
            )
        except Exception:  # unreachable, frozen, unknown model: it cannot say
            self._unknown.setdefault(key, time.monotonic())
            return (None,)
        self._unknown.pop(key, None)
        fingerprint = meta.SerializeToString(deterministic=True)
        if config is not None:
            fingerprint += config.SerializeToString(deterministic=True)
        return (Described(meta, config, fingerprint),)

    async def _config(self, key: Key) -> pb.ModelConfig | None:
        try:
            return (await self.services.config(*key, self.timeout_s)).config
        except aio.AioRpcError:  # a server without Triton's extension (MLServer's may lack it)
            return None
