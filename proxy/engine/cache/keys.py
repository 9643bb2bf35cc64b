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

    def all_now(self, targets: Sequence[Target]) -> tuple[bytes, ...] | None:
        """Every target's fingerprint if all are known and fresh, without waiting."""
        known = tuple(self.now(t) for t in targets)
        return None if None in known else known  # type: ignore[return-value]

    def now(self, target: Target) -> bytes | None:
        fresh = self._fresh.get((target.address, target.model, target.version))
        return None if fresh is None else fresh.peek()


HASH_IN_THREAD = 1 << 20
"""Inputs of more bytes than this are hashed on a worker thread (hashlib lets go of the GIL
while it hashes): on the event loop a 20 MiB upload held every other request 13.5 ms."""


def _contents(tensors: Mapping[str, np.ndarray]) -> tuple[list[bytes | memoryview], int]:
    """What a key hashes of `tensors`, in order: each one's name, datatype, shape and byte
    count, then its v2 raw contents, as pieces (a BYTES element's length prefix and its own
    bytes, never copied into one framed buffer first); and their total size."""
    parts: list[bytes | memoryview] = []
    size = 0
    for name in sorted(tensors):
        array = tensors[name]
        datatype = codec.datatype_of(array)
        if datatype == "BYTES":
            pieces = codec.bytes_element_parts(array.reshape(-1))
            length = sum(len(p) for p in pieces)
        else:
            raw = codec.to_raw_view(array)[1]
            pieces, length = [raw], len(raw)
        parts.append(orjson.dumps([name, datatype, list(array.shape), length]))
        parts += pieces
        size += length
    return parts, size


def _update(digest: hashlib._Hash, parts: list[bytes | memoryview]) -> None:
    for part in parts:
        digest.update(part)


async def _finish(digest: hashlib._Hash, inputs: Mapping[str, np.ndarray]) -> bytes:
    """`digest` (a copy of its base) updated with `inputs`, off the loop when they are big."""
    parts, size = _contents(inputs)
    if size > HASH_IN_THREAD:
        await asyncio.to_thread(_update, digest, parts)
    else:
        digest.update(b"".join(parts))  # one call: a few small updates cost more
    return digest.digest()


def _started(
    bases: MutableMapping[Any, tuple[Any, hashlib._Hash]],
    which: object,
    fingerprints: object,
    start: Callable[..., hashlib._Hash],
    *args: object,
) -> hashlib._Hash:
    """A copy of the digest of everything but the request (`start(*args)`, kept in `bases`
    under `which` until its models' fingerprints change)."""
    base = bases.get(which)
    if base is None or base[0] != fingerprints:
        base = bases[which] = (fingerprints, start(*args))
    return base[1].copy()


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
    fingerprints = prints.all_now(targets) or await prints.of_all(targets)
    if fingerprints is None:
        return None
    base = _started(_bases, plan, fingerprints, _pipeline_base, plan, targets, fingerprints)
    return plan.name.encode() + b"\0" + await _finish(base, inputs)


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
    base = _started(_step_bases, which, fingerprint, _step_base, target, which[1], fingerprint)
    return STEPS + await _finish(base, inputs)
