"""The doorkeeper of `admit: second`: a key is refused once and admitted when it comes
again within the keys it remembers; a flood of unique keys neither fills it nor lets more
than a few percent in."""

from __future__ import annotations

import hashlib

from proxy.engine.cache.doorkeeper import Doorkeeper


def keys(first: int, count: int) -> list[bytes]:
    return [hashlib.sha256(i.to_bytes(8, "little")).digest() for i in range(first, first + count)]


def test_a_key_is_admitted_on_its_second_sighting() -> None:
    door = Doorkeeper(1000)
    some = keys(0, 500)
    assert [door.admits(k) for k in some].count(True) < 25  # false positives only
    assert all(door.admits(k) for k in some)


def test_a_key_is_remembered_for_at_least_as_many_keys_as_it_keeps() -> None:
    door = Doorkeeper(1000)
    first = keys(0, 1000)
    for key in first:
        door.admits(key)
    for key in keys(1000, 999):  # the generation turns over: the first ones stay
        door.admits(key)
    assert all(door.admits(k) for k in first)


def test_a_flood_of_unique_keys_lets_few_in_and_is_forgotten_in_time() -> None:
    door = Doorkeeper(1000)
    flood = keys(0, 20_000)
    admitted = [door.admits(k) for k in flood].count(True)
    assert admitted < 0.05 * len(flood), f"{admitted} unique keys let in"
    # Two generations later, the flood's first keys are forgotten: refused again.
    assert [door.admits(k) for k in flood[:500]].count(True) < 25
