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
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import orjson

from protos import codec
from protos.version import code_digest
from proxy.engine.cache.fingerprints import Base, Fingerprints
from proxy.engine.plan import Plan
from proxy.transport.target import Target

ENGINE_SOURCES = tuple(sorted(Path(__file__).parents[1].rglob("*.py")))
"""The engine's source (plans, combinations, results, the cache itself)."""
SCHEME = b"mesh-cache-2" + code_digest(ENGINE_SOURCES).encode()
"""Bumped when the key or the entry layout changes, and moved by any change of the engine's
code (which makes the answers from the models' outputs): old entries are never read."""
STEPS = b"steps\0"


MAX_BASES = 4096

HASH_IN_THREAD = 1 << 20
"""Inputs of more bytes than this are hashed on a worker thread (hashlib lets go of the GIL
while it hashes): on the event loop a 20 MiB upload held every other request 13.5 ms."""


def _contents(array: np.ndarray) -> tuple[list[bytes | memoryview], int]:
    """What a tensor's digest covers, in order: its datatype, shape and byte count, then its
    v2 raw contents, as pieces (a BYTES element's length prefix and its own bytes, never
    copied into one framed buffer first); and the contents' size."""
    datatype = codec.datatype_of(array)
    if datatype == "BYTES":
        pieces = codec.bytes_element_parts(array)
        length = sum(map(len, pieces))
    else:
        raw = codec.to_raw_view(array)[1]
        pieces, length = [raw], len(raw)
    return [_head(datatype, list(array.shape), length), *pieces], length


def _head(datatype: str, shape: list[int], length: int) -> bytes:
    """What a tensor's digest covers before its contents."""
    return orjson.dumps([datatype, shape, length])


_UPLOAD_HEAD = b'["BYTES",[1],%d]'
"""`_head` of an upload (one BYTES element) of a given framed length, made without a call."""


def _hashed(parts: list[bytes | memoryview]) -> bytes:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.digest()


async def digest_of(parts: list[bytes | memoryview], size: int) -> bytes:
    """SHA-256 over `parts` in order (`size` bytes in all): on a worker thread past
    HASH_IN_THREAD; below it in one call over their join (updates cost more)."""
    if size > HASH_IN_THREAD:
        return await asyncio.to_thread(_hashed, parts)
    return hashlib.sha256(b"".join(parts)).digest()


_digests: dict[int, tuple[weakref.ref, bytes]] = {}
"""id(array) -> (the array, its digest), for read-only arrays while they live: a tensor
digested for one key is not digested again for the next (an upload is, at once: rehashing
~400 bytes costs less than this). Read-only, so a digest cannot go stale."""
_MAX_DIGESTS = 4096


def _forget(key: int) -> Callable[[weakref.ref], None]:
    return lambda _: _digests.pop(key, None)


def _upload_digest(array: np.ndarray) -> bytes | None:
    """`_contents`' digest of an upload (one `bytes` element, shape [1]: every image a door
    takes) of at most HASH_IN_THREAD bytes, made at once; None for any other tensor. The
    same bytes hashed as `_contents` frames them (`_head`, then the element's length prefix
    and bytes), without its general steps: a `digits` key took ~5.5 us, most of it framing
    a 400-byte image."""
    if array.dtype != object or array.shape != (1,):
        return None
    element = array[0]
    if type(element) is not bytes or len(element) > HASH_IN_THREAD:
        return None
    size = len(element)
    return hashlib.sha256(_UPLOAD_HEAD % (size + 4) + codec.length_prefix(size) + element).digest()


def _known_digest(array: np.ndarray) -> bytes | None:
    known = _digests.get(id(array))
    return known[1] if known is not None and known[0]() is array else None


def _remember(array: np.ndarray, digest: bytes) -> bytes:
    if not array.flags.writeable:
        key = id(array)
        if len(_digests) >= _MAX_DIGESTS:
            _digests.clear()
        _digests[key] = (weakref.ref(array, _forget(key)), digest)
    return digest


async def _digest(array: np.ndarray) -> bytes:
    """The tensor's SHA-256 (`_contents`), off the loop when it is big."""
    known = _known_digest(array)
    if known is not None:
        return known
    parts, size = _contents(array)
    return _remember(array, await digest_of(parts, size))


async def _finish(base: hashlib._Hash, inputs: Mapping[str, np.ndarray]) -> bytes:
    """`base` (a copy of it) updated with each input's name and digest, in name order."""
    digest = base.copy()
    for name in sorted(inputs):
        digest.update(name.encode() + b"\0" + await _digest(inputs[name]))
    return digest.digest()


async def _fresh(
    known: Base | None,
    targets: Sequence[Target],
    prints: Fingerprints,
    start: Callable[[tuple[bytes, ...]], hashlib._Hash],
) -> Base | None:
    """`known` while fresh, else the base of the models' fingerprints now (None: some model
    cannot say its own now); `start` digests what comes before the request."""
    if known is not None and time.monotonic() < known.until:
        return known
    fingerprints = prints.all_now(targets) or await prints.of_all(targets)
    if fingerprints is None:
        return None
    if known is None or known.fingerprints != fingerprints:
        known = Base(start(fingerprints), fingerprints)
    known.until = prints.fresh_until(targets)
    return known


async def pipeline_key(
    plan: Plan, prints: Fingerprints, inputs: Mapping[str, np.ndarray]
) -> bytes | None:
    def start(fingerprints: tuple[bytes, ...]) -> hashlib._Hash:
        digest = hashlib.sha256(SCHEME)
        definition = plan.pipeline.model_dump(mode="json", exclude={"description", "cache"})
        digest.update(orjson.dumps([plan.name, definition], option=orjson.OPT_SORT_KEYS))
        labelled = zip(sorted(plan.every_target), plan.sorted_targets, fingerprints, strict=True)
        for label, target, fingerprint in labelled:
            digest.update(orjson.dumps([label, target.address, target.model, target.version]))
            digest.update(fingerprint)
        return digest

    return await _key(prints, plan, plan.sorted_targets, start, plan.name.encode() + b"\0", inputs)


def pipeline_key_now(
    plan: Plan, prints: Fingerprints, inputs: Mapping[str, np.ndarray]
) -> bytes | None:
    """`pipeline_key` made without waiting, as most are (the models' fingerprints fresh,
    the inputs small); None: ask `pipeline_key`."""
    return _key_now(prints, plan, plan.name.encode() + b"\0", inputs)


def step_key_now(
    target: Target,
    outputs: tuple[str, ...],
    prints: Fingerprints,
    inputs: Mapping[str, np.ndarray],
) -> bytes | None:
    """`step_key` made without waiting, as most are; None: ask `step_key`."""
    return _key_now(prints, (target, outputs), STEPS, inputs)


async def step_key(
    target: Target,
    outputs: Sequence[str],
    prints: Fingerprints,
    inputs: Mapping[str, np.ndarray],
) -> bytes | None:
    which = (target, tuple(outputs))

    def start(fingerprints: tuple[bytes, ...]) -> hashlib._Hash:
        digest = hashlib.sha256(SCHEME + b"step")
        digest.update(orjson.dumps([target.address, target.model, target.version, which[1]]))
        digest.update(fingerprints[0])
        return digest

    return await _key(prints, which, (target,), start, STEPS, inputs)


async def _key(
    prints: Fingerprints,
    which: object,
    targets: Sequence[Target],
    start: Callable[[tuple[bytes, ...]], hashlib._Hash],
    prefix: bytes,
    inputs: Mapping[str, np.ndarray],
) -> bytes | None:
    """`prefix` and the digest of `which`'s base (kept in `prints.bases`) and `inputs`."""
    made = _key_now(prints, which, prefix, inputs)  # no await: most requests
    if made is not None:
        return made
    known = prints.bases.get(which)
    base = await _fresh(known, targets, prints, start)
    if base is None:
        return None
    if base is not known:
        if len(prints.bases) >= MAX_BASES:
            prints.bases.clear()  # targets made anew without end (v2 model calls'): start over
        prints.bases[which] = base
    return prefix + await _finish(base.digest, inputs)


def _key_now(
    prints: Fingerprints, which: object, prefix: bytes, inputs: Mapping[str, np.ndarray]
) -> bytes | None:
    """`_key` while `which`'s base is fresh and every input can be hashed at once (an upload
    small enough, hashed again for each key: cheaper than remembering it; or a tensor whose
    digest is known), else None. One function, not one a step: a key is made twice a
    request (the pipeline's, its first step's), and each call frame is a measurable share
    of what a miss costs the proxy (bench/README, 2026-12-03)."""
    known = prints.bases.get(which)
    if known is None or time.monotonic() >= known.until:
        return None
    digest = known.digest.copy()
    for name in sorted(inputs) if len(inputs) > 1 else inputs:
        array = inputs[name]
        made = _upload_digest(array)
        if made is None and (made := _known_digest(array)) is None:
            return None
        digest.update(name.encode() + b"\0" + made)
    return prefix + digest.digest()
