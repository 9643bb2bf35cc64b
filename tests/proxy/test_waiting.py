"""A request that finds its pipeline at its limits waits for room, first come first served,
while the pipeline's pace says it would be answered within its budget (engine/room.py); it
leaves the line, and gives back any room handed to it, however it ends."""

from __future__ import annotations

import asyncio

import pytest

from proxy import metrics
from proxy.engine.admission import Admission
from proxy.engine.room import PipelineLimits
from proxy.errors import Problem


class Held:
    """A request of `pipeline` admitted in a task, holding its room until released."""

    def __init__(self, admission: Admission, pixels: int = 0, **kwargs: object) -> None:
        self.inside = asyncio.Event()
        self.release = asyncio.Event()
        self.task = asyncio.ensure_future(self._run(admission, pixels, kwargs))

    async def _run(self, admission: Admission, pixels: int, kwargs: dict) -> None:
        async with admission.admit("ocr", pixels, **kwargs):
            self.inside.set()
            await self.release.wait()

    async def enters(self) -> None:
        await asyncio.wait_for(self.inside.wait(), 5)

    async def ends(self) -> None:
        self.release.set()
        await asyncio.wait_for(self.task, 5)


def _admission(**limits: int) -> Admission:
    """An admission whose `ocr` has a pace known (two requests ended while sharing it,
    a terapixel each in next to no time: any line here is through within its budget)."""
    admission = Admission(100, 1 << 30, 1 << 28, {"ocr": PipelineLimits(**limits)})
    pace = admission.room("ocr").pace
    assert pace is not None and not pace.known
    tokens = [pace.started(1 << 40), pace.started(1 << 40)]
    for token in tokens:
        pace.ended(token, answered=True)
    expected = pace.queued_s(1 << 30, 1 << 30)
    assert pace.known and expected is not None and expected < 0.01
    return admission


def _empty(admission: Admission) -> None:
    """Nothing held, nothing waiting: every way in was given back."""
    room = admission.room("ocr")
    assert (room.in_flight, room.pixels, len(room.line), room.queued) == (0, 0, 0, 0)
    assert (admission._requests, admission._clients) == (0, 0)
    assert metrics.WAITING.labels("ocr")._value.get() == 0


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_requests_wait_for_room_in_the_order_they_came() -> None:
    admission = _admission(max_in_flight=1)
    first = Held(admission, left_s=10)
    await first.enters()
    second, third = Held(admission, left_s=10), Held(admission, left_s=10)
    await _settle()
    assert not second.inside.is_set() and not third.inside.is_set()
    assert len(admission.room("ocr").line) == 2
    assert metrics.WAITING.labels("ocr")._value.get() == 2
    await first.ends()
    await second.enters()
    assert not third.inside.is_set()  # one at a time, as the limit says
    await second.ends()
    await third.enters()
    await third.ends()
    _empty(admission)


async def test_a_small_request_does_not_pass_a_large_one_that_waits() -> None:
    """Strictly in order: a page waiting for megapixels is not starved by small ones that
    would each fit beside what runs."""
    admission = _admission(max_pixels=10_000_000)
    first = Held(admission, 9_000_000, left_s=10)
    await first.enters()
    page, line = Held(admission, 5_000_000, left_s=10), Held(admission, 100_000, left_s=10)
    await _settle()
    assert not page.inside.is_set() and not line.inside.is_set()
    await first.ends()
    await page.enters()
    await line.enters()  # both fit once the first is gone
    await page.ends()
    await line.ends()
    _empty(admission)


async def test_a_waiter_that_leaves_takes_nothing_with_it() -> None:
    admission = _admission(max_in_flight=1)
    first = Held(admission, left_s=10)
    await first.enters()
    hung_up = Held(admission, left_s=10)
    after = Held(admission, left_s=10)
    await _settle()
    hung_up.task.cancel()  # the client went away while it waited
    with pytest.raises(asyncio.CancelledError):
        await hung_up.task
    assert len(admission.room("ocr").line) == 1
    await first.ends()
    await after.enters()  # the room went to the next in line
    await after.ends()
    _empty(admission)


async def test_room_handed_to_a_waiter_as_it_is_cancelled_is_given_back() -> None:
    admission = _admission(max_in_flight=1)
    async with admission.admit("ocr", 0, left_s=10):
        waiter = Held(admission, left_s=10)
        await _settle()
    # The room is the waiter's now (reserved as the first left), but its task has not run:
    # cancelled in this very turn, it never takes it.
    assert admission.room("ocr").in_flight == 1
    waiter.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter.task
    _empty(admission)
    async with admission.admit("ocr", 0, left_s=10):  # and the room is there
        pass


async def test_a_waiter_whose_budget_ends_gets_504_and_leaves_the_line() -> None:
    admission = _admission(max_in_flight=1)
    first = Held(admission, left_s=10)
    await first.enters()
    with pytest.raises(Problem) as info:
        async with admission.admit("ocr", 0, left_s=0.2):
            pass
    assert info.value.status == 504
    assert "had no room for the request within its budget (0.20 s" in info.value.message
    await first.ends()
    _empty(admission)


async def test_the_line_is_bounded_and_a_request_without_a_budget_never_waits() -> None:
    admission = _admission(max_in_flight=1, max_queued=1)
    first = Held(admission, left_s=10)
    await first.enters()
    waiting = Held(admission, left_s=10)
    await _settle()
    with pytest.raises(Problem) as info:
        async with admission.admit("ocr", 0, left_s=10):
            pass
    assert info.value.status == 503
    assert "at capacity (1 requests in flight, 1 waiting for room)" in info.value.message
    with pytest.raises(Problem, match="at capacity"):
        async with admission.admit("ocr", 0):  # no budget to wait within
            pass
    await first.ends()
    await waiting.enters()
    await waiting.ends()
    _empty(admission)


async def test_waiters_the_pace_says_would_be_late_are_told_so_and_jobs_never_are() -> None:
    """At the pipeline's pace, a request whose budget the work ahead of it (in flight and
    waiting before it) would outlast is told at once (503), or as soon as a slower pace
    says so, rather than left to time out; a job waits its turn whatever the pace."""
    admission = _admission(max_in_flight=1)
    first = Held(admission, 1_000_000, left_s=100)
    await first.enters()
    pace = admission.room("ocr").pace
    assert pace is not None
    pace.queued_s = lambda work, queued: 2.0 + queued / 1e6  # type: ignore[method-assign]
    with pytest.raises(Problem) as info:  # 2 s ahead, 1.5 s left: at once
        async with admission.admit("ocr", 1_000_000, left_s=1.5):
            pass
    assert info.value.status == 503 and "~2.00 s of work ahead" in info.value.message
    assert info.value.retry_after == "1"
    early = Held(admission, 1_000_000, left_s=30)
    job = Held(admission, 1_000_000, background=True, left_s=2.5)
    later = Held(admission, 1_000_000, left_s=30)
    await _settle()
    assert len(admission.room("ocr").line) == 3  # a job is not judged by its budget
    # Slower: 20 s for the first in line, 40 s behind the job's megapixel.
    pace.queued_s = lambda work, queued: 20.0 + queued / 5e4  # type: ignore[method-assign]
    await first.ends()  # room for `early`; the rest judged at the slower pace
    await early.enters()
    with pytest.raises(Problem) as info:
        await asyncio.wait_for(later.task, 5)
    assert info.value.status == 503 and "~40.00 s of work ahead" in info.value.message
    assert [w.background for w in admission.room("ocr").line] == [True]
    await early.ends()
    await job.enters()
    await job.ends()
    _empty(admission)


async def test_with_shedding_off_a_waiter_waits_its_whole_budget() -> None:
    admission = Admission(
        100, 1 << 30, 1 << 28, {"ocr": PipelineLimits(max_in_flight=1)}, shed_late=False
    )
    first = Held(admission, left_s=10)
    await first.enters()
    assert admission.room("ocr").pace is None
    second = Held(admission, left_s=10)
    await _settle()
    await first.ends()
    await second.enters()
    await second.ends()
    _empty(admission)


async def test_until_its_pace_is_known_a_pipeline_at_its_limits_refuses_at_once() -> None:
    """Nothing says yet how long the line would take: 32 clients sending 6000x6000 photos
    to `digits`, which runs them one at a time, waited and were let in to time out in the
    preprocessing. A job still waits its turn."""
    admission = Admission(100, 1 << 30, 1 << 28, {"ocr": PipelineLimits(max_in_flight=1)})
    first = Held(admission, left_s=10)
    await first.enters()
    with pytest.raises(Problem) as info:
        async with admission.admit("ocr", 0, left_s=10):
            pass
    assert info.value.status == 503 and "at capacity (1 requests in flight)" in info.value.message
    job = Held(admission, background=True, left_s=10)
    await _settle()
    assert len(admission.room("ocr").line) == 1
    await first.ends()
    await job.enters()
    await job.ends()
    _empty(admission)


async def test_a_waiter_with_too_little_budget_left_is_told_so_not_let_in() -> None:
    """Room comes for the first in line, but the work in flight would now outlast what is
    left of its budget: 503 with the pace's figures, and the room goes to the next."""
    admission = _admission(max_in_flight=1)
    first = Held(admission, left_s=100)
    await first.enters()
    hurried = Held(admission, 1_000_000, left_s=3)
    patient = Held(admission, 1_000_000, left_s=100)
    await _settle()
    pace = admission.room("ocr").pace
    assert pace is not None
    pace.queued_s = lambda work, queued: 5.0 + queued / 1e6  # type: ignore[method-assign]
    await first.ends()
    with pytest.raises(Problem) as info:
        await asyncio.wait_for(hurried.task, 5)
    assert info.value.status == 503 and "~5.00 s of work ahead" in info.value.message
    await patient.enters()
    await patient.ends()
    _empty(admission)
