"""Admitting an answer on its key's second sighting (`cache: {admit: second}`).

Keeping an answer costs more than its key and lookup: the entry is made and copied, the
store grows, evicts and is walked by the garbage collector's young passes. With no repeats,
a cache keeping every answer cost the proxy 1.11-1.29x the CPU a `digits` request of no cache
at all, one keeping none ~1.05x (bench/README, 2026-11-29): the difference spent on entries
nobody asks for again. A doorkeeper (TinyLFU's) remembers the keys seen
once lately, in a few bits each, and lets an answer in only when its key comes again: a
stream of unique inputs then costs a hash and two bit tests a request, and a repeated input
is kept at its second computation and a hit from its third request on. The price: the
first repeat (a client's retry) is computed once more.

In process, each proxy process keeps its own (`Doorkeeper`). With the entries in Redis, the
sightings are kept there too (`SharedDoorkeeper`), so that replicas sharing the entries share
what they have seen: a request first sent to one replica and retried on another is kept
there, where a doorkeeper per process would wait for a second sighting on the same one (among
R replicas behind a balancer, ~R sightings).
"""

from __future__ import annotations

BITS_PER_KEY = 16
"""Two bit tests at 16 bits a key, in two generations, let ~2% of new keys in as if seen
(at 8 bits, ~6%)."""
_WORD = 0xFFFF_FFFF_FFFF_FFFF


class Doorkeeper:
    """The keys seen lately, as a Bloom filter in two generations: a key is remembered for
    at least `keys` new keys after it (then the older generation is dropped whole, so the
    filter never fills). A false positive admits an answer early: never a wrong answer, only
    an entry kept sooner. Keys are the caches' (already cryptographic digests), so the two
    bit positions are cut from Python's hash of them, cached on the bytes object."""

    __slots__ = ("_added", "_before", "_keys", "_mask", "_now")

    def __init__(self, keys: int) -> None:
        self._keys = max(keys, 1)
        bits = _bits(self._keys)
        self._mask = bits - 1
        self._now = bytearray(bits // 8)
        self._before = bytearray(bits // 8)
        self._added = 0

    def admits(self, key: bytes) -> bool:
        """Whether `key` was seen lately; if it was not, it is remembered and refused."""
        h = hash(key) & _WORD
        a = h & self._mask
        b = (h >> 32) & self._mask
        now = self._now
        before = self._before
        if (now[a >> 3] >> (a & 7)) & (now[b >> 3] >> (b & 7)) & 1:
            return True
        if (before[a >> 3] >> (a & 7)) & (before[b >> 3] >> (b & 7)) & 1:
            return True
        now[a >> 3] |= 1 << (a & 7)
        now[b >> 3] |= 1 << (b & 7)
        self._added += 1
        if self._added >= self._keys:
            self._before = now
            self._now = bytearray(len(now))
            self._added = 0
        return False


def _bits(keys: int) -> int:
    """A generation's bits for `keys` keys: a power of two (positions are masked), 1 Ki to
    4 Gi (Redis's largest string)."""
    return min(max(1 << (keys * BITS_PER_KEY - 1).bit_length(), 1024), 1 << 32)


class SharedDoorkeeper:
    """`Doorkeeper`'s filter kept in Redis, beside the entries, under `name` (a prefix of
    its three keys: the two generations' bits and the current one's count). Its bits are
    read and set by the entry's lookup itself, in one script (`RedisStore.get_seen`): no
    round trip of its own. A key's two positions are cut from its own last bytes (the end of
    a SHA-256 digest), the same in every process."""

    __slots__ = ("_mask", "keys", "names")

    def __init__(self, name: bytes, keys: int) -> None:
        self.keys = max(keys, 1)
        self._mask = _bits(self.keys) - 1
        self.names = (name + b"now", name + b"before", name + b"added")

    def positions(self, key: bytes) -> tuple[int, int]:
        h = int.from_bytes(key[-8:], "little")
        return h & self._mask, (h >> 32) & self._mask
