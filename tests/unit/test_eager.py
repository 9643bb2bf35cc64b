"""protos/eager.py: a coroutine's first step taken at once, the rest awaited as if the
coroutine had been awaited from the start (results, errors, timeouts, cancellation)."""

from __future__ import annotations

import asyncio

import pytest

from protos.eager import Pending, eager


async def at_once(value: int) -> int:
    return value + 1


async def waits(future: asyncio.Future[int], log: list[str]) -> int:
    try:
        first = await future
        await asyncio.sleep(0)  # and waits once more
        return first * 2
    except asyncio.CancelledError:
        log.append("cancelled")
        raise
    finally:
        log.append("finally")


async def test_a_coroutine_that_never_waits_gives_its_result_at_once() -> None:
    assert eager(at_once(1)) == 2


async def test_an_error_raised_before_any_wait_is_raised_at_once() -> None:
    async def refuses() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        eager(refuses())


async def test_a_coroutine_that_waits_is_finished_by_awaiting_the_rest() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    log: list[str] = []
    step = eager(waits(future, log))
    assert isinstance(step, Pending)
    asyncio.get_running_loop().call_soon(future.set_result, 21)
    assert await step == 42
    assert log == ["finally"]


async def test_a_timeout_while_the_rest_waits_cancels_the_coroutine_where_it_waits() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    log: list[str] = []
    step = eager(waits(future, log))
    assert isinstance(step, Pending)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await step
    assert log == ["cancelled", "finally"]
    assert future.cancelled()  # what it waited for was let go, as a task's cancel does


async def test_the_awaiting_task_cancelled_cancels_the_coroutine() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    log: list[str] = []

    async def awaiting() -> int:
        step = eager(waits(future, log))
        assert isinstance(step, Pending)
        return await step

    task = asyncio.create_task(awaiting())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["cancelled", "finally"]


async def test_a_rest_never_awaited_is_closed_where_it_waits() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    log: list[str] = []
    step = eager(waits(future, log))
    assert isinstance(step, Pending)
    step.close()
    assert log == ["finally"]
