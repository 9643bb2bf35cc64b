"""A request whose budget the work in flight would outlast is refused at once (503), from the
pace the pipeline answers at; never a job's, never with fewer than two in flight, never where
requests cost too little for a refusal to save anything."""

from __future__ import annotations

import math
import re
from contextlib import AsyncExitStack

import pytest

from proxy import metrics
from proxy.engine import pace as pace_module
from proxy.engine.admission import SHED_FROM, Admission
from proxy.engine.pace import MIN_DONE, Pace
from proxy.errors import Problem


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(pace_module.time, "monotonic", clock)
    return clock


def _answer(pace: Pace, clock: Clock, work: int, seconds: float, answered: bool = True) -> None:
    pace.started(work)
    clock.now += seconds
    pace.ended(work, answered)


def test_the_expected_time_is_the_work_in_flight_and_its_own_over_the_pace(clock: Clock) -> None:
    pace = Pace()
    for _ in range(int(MIN_DONE) - 1):
        _answer(pace, clock, 1_000_000, 0.5)
        assert pace.expected_s(1_000_000) is None  # too few answers to say
    for _ in range(3):
        _answer(pace, clock, 1_000_000, 0.5)
    # 2 Mpx a second while busy; nothing in flight: its own megapixel, ~0.5 s.
    assert pace.expected_s(1_000_000) == pytest.approx(0.5, rel=0.01)
    pace.started(3_000_000)
    pace.started(2_000_000)
    assert pace.expected_s(1_000_000) == pytest.approx(3.0, rel=0.01)
    assert pace.expected_s(4_000_000) == pytest.approx(4.5, rel=0.01)


def test_idle_time_is_not_counted_and_failures_prove_no_pace(clock: Clock) -> None:
    pace = Pace()
    for _ in range(8):
        _answer(pace, clock, 100, 0.1)
        clock.now += 0.4  # idle between requests: not the pipeline's time
    assert pace.expected_s(100) == pytest.approx(0.1, rel=0.05)
    slow = Pace()
    for _ in range(8):
        _answer(slow, clock, 100, 0.1)
    for _ in range(20):  # ran out of time: their share freed, but nothing answered
        _answer(slow, clock, 100, 1.0, answered=False)
    # The failures' time counts against the pace (the cores were busy), their work does not.
    assert slow.expected_s(100) is not None and slow.expected_s(100) > 1.0


def test_a_pipeline_where_every_request_runs_out_is_read_as_never_in_time(clock: Clock) -> None:
    pace = Pace()
    for _ in range(5):
        _answer(pace, clock, 1, 0.25, answered=False)
    assert pace.expected_s(1) == math.inf
    _answer(pace, clock, 1, 0.25)  # one got through: its pace again
    assert 1.0 < pace.expected_s(1) < 1.6  # six quarter-seconds busy for one answer


def test_what_was_measured_fades(clock: Clock) -> None:
    pace = Pace()
    for _ in range(10):
        _answer(pace, clock, 1, 1.0)
    clock.now += 60  # a minute without requests: the old pace is forgotten
    assert pace.expected_s(1) is None
    for _ in range(40):
        _answer(pace, clock, 1, 0.05)  # the services got faster
    assert pace.expected_s(1) == pytest.approx(0.05, rel=0.1)


def test_requests_that_cost_little_are_never_refused(clock: Clock) -> None:
    pace = Pace()
    for _ in range(100):
        _answer(pace, clock, 1, 0.001)  # ~1 ms a request, as digits
    for _ in range(50):
        pace.started(1)
    assert pace.expected_s(1) is None


async def _primed(clock: Clock, **kwargs: object) -> Admission:
    kwargs.setdefault("shed_late", True)
    admission = Admission(100, 1 << 30, 1 << 28, **kwargs)  # type: ignore[arg-type]
    for _ in range(8):  # one request a second of busy time
        async with admission.admit("ocr", 1_000_000, left_s=10):
            clock.now += 1.0
    return admission


async def test_a_request_its_budget_cannot_cover_is_refused_at_once(clock: Clock) -> None:
    admission = await _primed(clock)
    shed = _shed("ocr")
    async with AsyncExitStack() as running:
        for _ in range(SHED_FROM):
            await running.enter_async_context(admission.admit("ocr", 1_000_000, left_s=10))
        # Two pages ahead and its own: ~3 s at one a second.
        with pytest.raises(Problem) as info:
            async with admission.admit("ocr", 1_000_000, left_s=2.5):
                pass
        assert info.value.status == 503
        assert "would not answer within the request's budget" in info.value.message
        assert "~3.00 s of work ahead" in info.value.message and "2.50 s left" in info.value.message
        assert _shed("ocr") == shed + 1
        async with admission.admit("ocr", 1_000_000, left_s=3.5):
            clock.now += 1.0
        before = await _ahead(admission)
        with pytest.raises(ValueError):  # a failure in time: the work went through
            async with admission.admit("ocr", 1_000_000, left_s=3.5):
                clock.now += 1.0
                raise ValueError
        assert await _ahead(admission) == pytest.approx(before, rel=0.02)
        with pytest.raises(TimeoutError):  # ran out of time: busy, and nothing got through
            async with admission.admit("ocr", 1_000_000, left_s=3.5):
                clock.now += 3.5
                raise TimeoutError
        assert await _ahead(admission) > before * 1.3
        # A job waits its turn instead; a request without a budget is not judged by one.
        async with admission.admit("ocr", 1_000_000, background=True, left_s=0.1):
            pass
        async with admission.admit("ocr", 1_000_000, left_s=None):
            pass
    # With fewer than SHED_FROM in flight the cores have room: taken whatever its budget.
    async with (
        admission.admit("ocr", 1_000_000, left_s=10),
        admission.admit("ocr", 1_000_000, left_s=0.01),
    ):
        pass


async def test_shedding_can_be_turned_off(clock: Clock) -> None:
    admission = await _primed(clock, shed_late=False)
    async with AsyncExitStack() as running:
        for _ in range(5):
            await running.enter_async_context(admission.admit("ocr", 1_000_000, left_s=10))
        async with admission.admit("ocr", 1_000_000, left_s=0.01):
            pass


async def _ahead(admission: Admission) -> float:
    """The seconds of work ahead a request with no time left is refused for."""
    with pytest.raises(Problem) as info:
        async with admission.admit("ocr", 1_000_000, left_s=0.001):
            pass
    return float(re.search(r"~([\d.]+) s of work ahead", info.value.message).group(1))  # type: ignore[union-attr]


def _shed(pipeline: str) -> float:
    return metrics.SHED.labels(pipeline)._value.get()
