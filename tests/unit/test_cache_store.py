"""The in-process cache store: bounded in bytes whatever is put in it, least recently used
out first, entries expiring; entries pack and unpack without pickle."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from proxy import metrics
from proxy.engine.cache.entries import Stored, pack, unpack
from proxy.engine.cache.stores import MemoryStore


async def test_a_flood_of_unique_entries_stays_within_the_bound() -> None:
    store = MemoryStore(64 * 1024, "flood")
    evicted = metrics.CACHE_EVICTIONS.labels("flood")
    before = evicted._value.get()
    rng = np.random.default_rng(0)
    for i in range(2000):
        await store.put(b"p\0%d" % i, rng.bytes(int(rng.integers(100, 3000))), 60)
        assert store.bytes <= store.max_bytes
    assert evicted._value.get() - before > 1500
    assert await store.get(b"p\0%d" % 1999) is not None  # the newest stays
    assert await store.get(b"p\0%d" % 0) is None  # the oldest went


async def test_least_recently_used_goes_first() -> None:
    store = MemoryStore(300, "lru")
    for key in (b"a", b"b", b"c"):
        await store.put(key, b"x" * 100, 60)
    assert await store.get(b"a") is not None  # a used again: b is now the oldest
    await store.put(b"d", b"x" * 100, 60)
    assert await store.get(b"b") is None
    assert all([await store.get(k) is not None for k in (b"a", b"c", b"d")])
    await store.put(b"huge", b"x" * 301, 60)  # larger than the whole store: never kept
    assert await store.get(b"huge") is None and store.bytes == 300


async def test_entries_expire_and_clear_by_prefix() -> None:
    store = MemoryStore(10_000, "ttl")
    await store.put(b"p\0one", b"1", 0.05)
    await store.put(b"p\0two", b"2", 60)
    await store.put(b"q\0one", b"3", 60)
    await asyncio.sleep(0.1)
    assert await store.get(b"p\0one") is None
    assert await store.clear(b"p\0") == 1
    assert await store.get(b"q\0one") == b"3" and store.bytes == 1


def test_entries_round_trip_every_datatype() -> None:
    stored = Stored(
        {
            "f": np.arange(6, dtype=np.float32).reshape(2, 3),
            "i": np.array([[-1, 2]], dtype=np.int64),
            "b": np.array([True, False]),
            "s": np.array([b"x", b"yz", b""], dtype=object),
            "empty": np.zeros((0, 4), dtype=np.float32),
        },
        {"ensemble": {"a": {"p": np.ones((1, 10), dtype=np.float32)}, "b": {}}},
    )
    back = unpack(pack(stored))
    for name, array in stored.tensors.items():
        assert back.tensors[name].dtype == array.dtype, name
        np.testing.assert_array_equal(back.tensors[name], array)
    np.testing.assert_array_equal(back.branches["ensemble"]["a"]["p"], np.ones((1, 10)))


@pytest.mark.parametrize("blob", [b"", b"\x05\0\0\0[1,2", b"\x02\0\0\0[]extra", b"pickle!"])
def test_a_foreign_value_is_refused(blob: bytes) -> None:
    with pytest.raises(ValueError, match="not a cache entry"):
        unpack(blob)
