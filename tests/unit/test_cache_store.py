"""The in-process cache store: bounded in bytes whatever is put in it, least recently used
out first, entries expiring; entries pack and unpack without pickle, and are kept in process
as tuples the garbage collector stops walking."""

from __future__ import annotations

import asyncio
import gc
import math

import numpy as np
import pytest

from proxy import metrics
from proxy.engine.cache.answers import Answers
from proxy.engine.cache.entries import Stored, keep, kept, pack, unpack
from proxy.engine.cache.stores import MemoryStore


async def test_rendered_results_stay_within_their_bound_and_clear_by_pipeline() -> None:
    """Hits' results as JSON (Caches.rendered), counted with their keys, never expiring."""
    rendered = MemoryStore(8 * 1024, "rendered-test")

    def put(key: bytes, text: bytes) -> None:
        rendered.put_now(key, text, len(key) + len(text), math.inf)

    rng = np.random.default_rng(1)
    for i in range(500):
        put(b"p\0%d" % i, rng.bytes(int(rng.integers(10, 600))))
        rendered.get_now(b"p\0%d" % 0)  # used on every round: stays
        assert rendered.bytes <= rendered.max_bytes
    assert rendered.get_now(b"p\0%d" % 0) is not None and rendered.get_now(b"p\0%d" % 1) is None
    put(b"q\0a", b"[1]")
    put(b"too big", b"x" * 9000)  # larger than the whole bound: never kept
    assert rendered.get_now(b"too big") is None
    await rendered.clear(b"p\0")
    assert rendered.get_now(b"p\0%d" % 0) is None and rendered.get_now(b"q\0a") == b"[1]"
    assert rendered.bytes == len(b"q\0a") + len(b"[1]")


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


def _every_datatype() -> Stored:
    return Stored(
        {
            "f": np.arange(6, dtype=np.float32).reshape(2, 3),
            "i": np.array([[-1, 2]], dtype=np.int64),
            "b": np.array([True, False]),
            "s": np.array([b"x", b"yz", b""], dtype=object),
            "empty": np.zeros((0, 4), dtype=np.float32),
        },
        {"ensemble": {"a": {"p": np.ones((1, 10), dtype=np.float32)}, "b": {}}},
    )


@pytest.mark.parametrize("way", ["packed", "kept"])
def test_entries_round_trip_every_datatype(way: str) -> None:
    stored = _every_datatype()
    back = unpack(pack(stored)) if way == "packed" else kept(keep(stored)[0])
    for name, array in stored.tensors.items():
        assert back.tensors[name].dtype == array.dtype, name
        np.testing.assert_array_equal(back.tensors[name], array)
    np.testing.assert_array_equal(back.branches["ensemble"]["a"]["p"], np.ones((1, 10)))


def test_a_kept_entry_owns_read_only_copies() -> None:
    answer = np.arange(40, dtype=np.float32).reshape(4, 10)  # a merged call's answer
    row = answer[1:2]  # one member's view of it
    entry, size = keep(Stored({"p": row}))
    layout, array = entry
    assert layout == ("", "", "p")
    assert array.base is None  # the merged answer is not pinned by the entry
    assert not array.flags.writeable  # an entry answers many requests at once
    answer[1] = -1  # the run's own arrays change: the entry does not
    np.testing.assert_array_equal(kept(entry).tensors["p"], np.arange(10, 20)[None])
    assert size >= row.nbytes


async def test_entries_kept_in_process_are_left_alone_by_the_garbage_collector() -> None:
    answers: Answers[Stored] = Answers(
        "gc", "", MemoryStore(2**30, "gc"), 60, lambda v: v, lambda e: e
    )
    entry = _every_datatype()

    async def compute() -> Stored:
        return entry

    gc.collect()
    before = len(gc.get_objects())
    for i in range(3000):
        await answers.answer(b"gc\0%d" % i, compute, 1e18)
    for _ in range(4):  # a pass stops tracking the tuples holding nothing it tracks
        gc.collect()
    # Each entry is a few levels of tuples of names and arrays: after as many passes, none
    # is tracked (as dicts and dataclasses, 3,000 entries were ~15,000 objects walked by
    # every full pass, for as long as they stayed).
    assert len(gc.get_objects()) - before < 300
    found, how = await answers.answer(b"gc\0%d" % 2999, compute, 1e18)
    assert how == "hit" and found is not entry
    np.testing.assert_array_equal(found.tensors["i"], entry.tensors["i"])


async def test_a_miss_leaves_two_objects_for_the_garbage_collector_to_count() -> None:
    """Each object the collector tracks counts toward its next young pass until a pass stops
    tracking it; a miss keeps an entry, so the objects one keeps set the passes' pace (one
    tuple per tensor made a `digits` miss leave 13)."""
    answers: Answers[Stored] = Answers(
        "gc", "", MemoryStore(2**30, "gc"), 60, lambda v: v, lambda e: e
    )
    entry = _every_datatype()  # six tensors

    async def compute() -> Stored:
        return entry

    await answers.answer(b"gc\0warm", compute, 1e18)
    gc.disable()
    try:
        before = gc.get_count()[0]
        for i in range(1000):
            await answers.answer(b"gc\0%d" % i, compute, 1e18)
        left = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert left <= 2 * 1000  # the entry's tuple and the store's record of it


@pytest.mark.parametrize("blob", [b"", b"\x05\0\0\0[1,2", b"\x02\0\0\0[]extra", b"pickle!"])
def test_a_foreign_value_is_refused(blob: bytes) -> None:
    with pytest.raises(ValueError, match="not a cache entry"):
        unpack(blob)


async def test_entries_stop_being_tracked_in_the_young_passes_not_only_the_full_ones() -> None:
    """A full pass walks every tracked object of the old generations: entries a young pass
    left tracked piled up there (41,000 of 50,000 `digits` answers) and each full pass walked
    them all. The store's record of an entry used to be a tuple holding the entry's tuple;
    the young pass met the record first, while the entry was still tracked, and kept both."""
    answers: Answers[Stored] = Answers(
        "gc", "", MemoryStore(2**30, "gc"), 60, lambda v: v, lambda e: e
    )
    entry = _every_datatype()

    async def compute() -> Stored:
        return entry

    await answers.answer(b"gc\0warm", compute, 1e18)
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for i in range(3000):
            await answers.answer(b"gc\0%d" % i, compute, 1e18)
            if i % 100 == 99:
                gc.collect(0)  # young passes only, as under load
        gc.collect(0)
        left = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert left < 300, f"{left} objects of 3,000 entries still tracked after young passes"


async def test_an_answer_the_cache_cannot_keep_is_still_answered(caplog) -> None:
    """Keeping an entry that fails (here: what it keeps cannot be made) costs the request
    nothing: it gets its computed answer, the failure is counted and logged, nothing kept."""

    def unkeepable(value: Stored) -> Stored:
        raise TypeError("not an entry")

    answers: Answers[Stored] = Answers(
        "broken", "", MemoryStore(2**20, "broken"), 60, unkeepable, lambda e: e
    )
    entry = _every_datatype()

    async def compute() -> Stored:
        return entry

    errors = metrics.CACHE_LOOKUPS.labels("broken", "", "error")
    before = errors._value.get()
    for _ in range(2):
        found, how = await answers.answer(b"k", compute, 1e18)
        assert found is entry and how == "miss"  # the second one too: nothing was kept
    assert errors._value.get() - before == 2
    assert "cache write failed" in caplog.text
