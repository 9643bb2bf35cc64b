"""A model's work under its request's deadline (v2server/deadline.py): answered in time,
cancelled at the deadline with TimeoutError, and a cancellation from outside kept as one."""

from __future__ import annotations

import asyncio

import pytest

from tests.leaks import Uploads, collector_off
from v2server.deadline import within


class Work:
    """A model's work that takes `seconds`, and says whether it was cancelled."""

    def __init__(self) -> None:
        self.cancelled = False

    async def run(self, seconds: float, answer: str = "answer") -> str:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return answer


def _in(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def test_work_done_in_time_is_answered_and_its_timer_gone() -> None:
    work = Work()
    assert await within(work.run(0.01), _in(5)) == "answer"
    await asyncio.sleep(0)  # nothing left to cancel the task later
    assert not work.cancelled and asyncio.current_task().cancelling() == 0


async def test_work_past_its_deadline_is_cancelled_with_timeout_error() -> None:
    work = Work()
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        await within(work.run(30), _in(0.05))
    assert work.cancelled
    assert asyncio.get_running_loop().time() - started < 5  # at the deadline, not the end
    # The task's cancel count is restored: an enclosing timeout still works as asyncio's.
    assert asyncio.current_task().cancelling() == 0
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await asyncio.sleep(5)


async def test_a_deadline_already_past_cancels_before_any_wait() -> None:
    work = Work()
    with pytest.raises(TimeoutError):
        await within(work.run(30), _in(-1))
    assert work.cancelled


async def test_a_cancellation_from_outside_stays_one() -> None:
    work = Work()
    task = asyncio.create_task(within(work.run(30), _in(30)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert work.cancelled


async def test_an_error_of_the_works_own_passes_through() -> None:
    async def broken() -> str:
        raise ValueError("model exploded")

    with pytest.raises(ValueError, match="model exploded"):
        await within(broken(), _in(5))


async def test_an_error_leaves_no_cycle_that_holds_the_request() -> None:
    # The error went on with within's frame in its traceback, and that frame held the task,
    # which ends up holding the error: a cycle only a full collection frees. Refused OCR
    # photos at the proxy's gRPC door kept 1.7 GB so, between full collections.
    uploads = Uploads()

    async def refused() -> None:
        _upload = uploads.new()
        await asyncio.sleep(0)
        raise RuntimeError("at capacity")

    async def call() -> None:  # as a door runs it: a task of its own
        await within(refused(), asyncio.get_running_loop().time() + 10)

    with collector_off():
        task = asyncio.create_task(call())
        with pytest.raises(RuntimeError, match="at capacity"):
            await task
        del task
        await asyncio.sleep(0)  # this step ran from the task's own wake-up, which held it
        assert uploads.alive() == 0  # gone with the error, no collection needed
