"""The byte window a service holds requests in (v2server/bytewindow.py): bytes that fit are
taken at once, waiters are served as bytes come back, and a waiter that leaves holds
nothing."""

from __future__ import annotations

import asyncio

import pytest

from v2server.bytewindow import ByteWindow


async def test_bytes_that_fit_are_taken_and_a_large_request_passes_alone() -> None:
    window = ByteWindow(100)
    assert window.take(60)
    assert not window.take(50)
    await window.wait_take(40)
    assert window.used == 100
    window.give(100)
    assert window.take(500)  # alone: larger than the limit, yet it may pass
    assert not window.take(1)


async def test_waiters_are_served_in_arrival_order_as_bytes_come_back() -> None:
    window = ByteWindow(100)
    window.take(100)
    order: list[str] = []

    async def wait(name: str, nbytes: int) -> None:
        await window.wait_take(nbytes)
        order.append(name)

    tasks = [asyncio.create_task(wait(n, b)) for n, b in (("a", 70), ("b", 20), ("c", 50))]
    await asyncio.sleep(0)
    assert order == [] and window.used == 100
    window.give(60)  # 40 held: `b` fits, `a` and `c` do not
    await asyncio.sleep(0)
    assert order == ["b"] and window.used == 60
    window.give(60)  # 0 held: `a` first (70), then `c` no longer fits
    await asyncio.sleep(0)
    assert order == ["b", "a"] and window.used == 70
    window.give(70)
    await asyncio.gather(*tasks)
    assert order == ["b", "a", "c"] and window.used == 50


async def test_a_waiter_that_leaves_holds_nothing() -> None:
    window = ByteWindow(100)
    window.take(100)
    waiting = asyncio.create_task(window.wait_take(80))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    window.give(100)
    assert window.used == 0


async def test_a_waiter_cancelled_after_its_bytes_were_granted_gives_them_back() -> None:
    window = ByteWindow(100)
    window.take(100)
    waiting = asyncio.create_task(window.wait_take(80))
    await asyncio.sleep(0)
    window.give(100)  # grants the waiter's 80 before it runs again
    assert window.used == 80
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert window.used == 0
