"""Cache keys: a SHA-256 over everything that decides an answer, so that an entry can only
ever be the answer to the request it is looked up for.

- A pipeline's answer: the pipeline's name and definition; for every model it may call, the
  address, the model and version asked for and the model's fingerprint (its versions, platform
  and tensors, from the service's metadata: a new version loaded, or another server behind the
  same variable, changes the key); and the request's tensors (names, datatypes, shapes, bytes).
- A step's outputs: the model's address, name, version and fingerprint, the outputs asked
  for, and the input tensors.

A pipeline's keys start with `<pipeline>\\0`, so that its entries can be cleared together;
steps' keys with `steps\\0` (shared by every pipeline calling the same model with the same
inputs, e.g. the preprocessing of `digits` and `digits-partial`).
Fingerprints are asked of the services at most once per `check_s` per model; a model whose
service cannot say now has no fingerprint, and its requests go uncached.
"""

from __future__ import annotations

import asyncio
import hashlib
import weakref
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
import orjson

from protos import codec
from proxy.engine.plan import Plan
from proxy.transport.fresh import Fresh
from proxy.transport.services import Services
from proxy.transport.target import Target

SCHEME = b"mesh-cache-1"
STEPS = b"steps\0"
"""Bumped when the key or the entry layout changes: old entries are never read."""


class Fingerprints:
    def __init__(self, services: Services, check_s: float, timeout_s: float) -> None:
        self.services = services
        self.check_s = check_s
        self.timeout_s = timeout_s
        self._fresh: dict[tuple[str, str, str], Fresh[bytes | None]] = {}

    async def of(self, target: Target) -> bytes | None:
        key = (target.address, target.model, target.version)
        fresh = self._fresh.get(key)
        if fresh is None:
            fresh = self._fresh[key] = Fresh(lambda: self._ask(*key), self.check_s)
        return await fresh.get()

    async def _ask(self, address: str, model: str, version: str) -> bytes | None:
        try:
            meta = await self.services.metadata(address, model, version, self.timeout_s)
        except Exception:  # unreachable, unknown model: no fingerprint, no caching
            return None
        return meta.SerializeToString(deterministic=True)

    async def of_all(self, targets: Sequence[Target]) -> tuple[bytes, ...] | None:
        known = [self.now(t) for t in targets]
        if any(p is None for p in known):  # some to ask again (once per check_s)
            known = await asyncio.gather(*(self.of(t) for t in targets))
        return None if any(p is None for p in known) else tuple(known)  # type: ignore[arg-type]

    def now(self, target: Target) -> bytes | None:
        fresh = self._fresh.get((target.address, target.model, target.version))
        return None if fresh is None else fresh.peek()


def _tensors(digest: hashlib._Hash, tensors: Mapping[str, np.ndarray]) -> None:
    for name in sorted(tensors):
        datatype, raw = codec.to_raw_view(tensors[name])
        digest.update(orjson.dumps([name, datatype, list(tensors[name].shape), len(raw)]))
        digest.update(raw)


def _digest(
    bases: MutableMapping[Any, tuple[Any, hashlib._Hash]],
    which: object,
    fingerprints: object,
    inputs: Mapping[str, np.ndarray],
    start: Callable[..., hashlib._Hash],
    *args: object,
) -> bytes:
    """The digest of everything but the request (`start(*args)`, kept in `bases` under
    `which` until its models' fingerprints change), then of the request's `inputs`."""
    base = bases.get(which)
    if base is None or base[0] != fingerprints:
        base = bases[which] = (fingerprints, start(*args))
    digest = base[1].copy()
    _tensors(digest, inputs)
    return digest.digest()


_bases: weakref.WeakKeyDictionary[Plan, tuple[tuple[bytes, ...], hashlib._Hash]] = (
    weakref.WeakKeyDictionary()
)
"""Plan -> (its models' fingerprints, the digest of everything but the request)."""


def _pipeline_base(
    plan: Plan, targets: Sequence[Target], fingerprints: tuple[bytes, ...]
) -> hashlib._Hash:
    digest = hashlib.sha256(SCHEME)
    definition = plan.pipeline.model_dump(mode="json", exclude={"description", "cache"})
    digest.update(orjson.dumps([plan.name, definition], option=orjson.OPT_SORT_KEYS))
    for label, target, fingerprint in zip(sorted(plan.targets), targets, fingerprints, strict=True):
        digest.update(orjson.dumps([label, target.address, target.model, target.version]))
        digest.update(fingerprint)
    return digest


async def pipeline_key(
    plan: Plan, prints: Fingerprints, inputs: Mapping[str, np.ndarray]
) -> bytes | None:
    targets = plan.sorted_targets
    fingerprints = await prints.of_all(targets)
    if fingerprints is None:
        return None
    digest = _digest(
        _bases, plan, fingerprints, inputs, _pipeline_base, plan, targets, fingerprints
    )
    return plan.name.encode() + b"\0" + digest


_step_bases: dict[tuple[Target, tuple[str, ...]], tuple[bytes, hashlib._Hash]] = {}
"""(target, outputs) -> (its model's fingerprint, the digest of everything but the inputs)."""


def _step_base(target: Target, outputs: tuple[str, ...], fingerprint: bytes) -> hashlib._Hash:
    digest = hashlib.sha256(SCHEME + b"step")
    digest.update(orjson.dumps([target.address, target.model, target.version, outputs]))
    digest.update(fingerprint)
    return digest


async def step_key(
    target: Target,
    outputs: Sequence[str],
    prints: Fingerprints,
    inputs: Mapping[str, np.ndarray],
) -> bytes | None:
    fingerprint = prints.now(target) or await prints.of(target)
    if fingerprint is None:
        return None
    which = (target, tuple(outputs))
    return STEPS + _digest(
        _step_bases, which, fingerprint, inputs, _step_base, target, which[1], fingerprint
    )
