"""A request whose budget the work in flight would outlast is refused at once (503), from the
pace the pipeline answers at; never a job's, never with fewer than two in flight, never where
requests cost too little for a refusal to save anything."""

from __future__ import annotations

import asyncio
import math
from contextlib import AsyncExitStack

import pytest

from proxy import metrics
from proxy.engine import pace as pace_module
from proxy.engine.admission import SHED_FROM, Admission
from proxy.engine.pace import MIN_DONE, Pace
from proxy.engine.room import PipelineLimits
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


def _shared(
    pace: Pace, clock: Clock, work: int, seconds: float, n: int, answered: bool = True
) -> None:
    """`n` + 1 requests two at a time, one ending every `seconds`, as processor sharing
    serves them at `work` a `seconds`: each has half of the pipeline for twice `seconds`.
    The first and the last share it half as long, so they bring half the work."""
    first = pace.started(work // 2 or 1)
    for i in range(n):
        following = pace.started(work // 2 or 1 if i == n - 1 else work)
        clock.now += seconds
        pace.ended(first, answered)
        first = following
    pace.ended(first, answered)


def test_the_expected_time_is_the_work_left_ahead_and_its_own_over_the_pace(
    clock: Clock,
) -> None:
    pace = Pace()
    _shared(pace, clock, 1_000_000, 0.5, int(MIN_DONE) - 2)
    assert pace.expected_s(1_000_000) is None  # too few answers to say
    _shared(pace, clock, 1_000_000, 0.5, 4)
    # 2 Mpx a second while shared; nothing in flight: its own megapixel, ~0.5 s.
    assert pace.expected_s(1_000_000) == pytest.approx(0.5, rel=0.01)
    pace.started(3_000_000)
    pace.started(2_000_000)
    # Processor sharing: a 1 Mpx request waits for 1 Mpx of each, a 4 Mpx one for all.
    assert pace.expected_s(1_000_000) == pytest.approx(1.5, rel=0.01)
    assert pace.expected_s(4_000_000) == pytest.approx(4.5, rel=0.01)
    clock.now += 0.5  # half a second of the two sharing 2 Mpx a second: 0.5 Mpx each done
    assert pace.expected_s(4_000_000) == pytest.approx((2.5e6 + 1.5e6 + 4e6) / 2e6, rel=0.01)


def test_a_crowds_first_answer_reads_the_pace_right(clock: Clock) -> None:
    """Requests that came together each have a share of the pipeline: the first to end
    brings its work over its share, not over the seconds all of them were served. Read as
    the work answered over the seconds shared, three pages taken together at 3 Mpx a second
    said 1 Mpx a second as the first ended, and the crowd waiting behind them was told it
    would wait three times what it did (the 4th of four scanning clients: 25 s for 8 s)."""
    pace = Pace()
    tokens = [pace.started(work) for work in (6_000_000, 7_000_000, 8_000_000)]
    for seconds, token in zip((6.0, 2 / 3, 1 / 3), tokens, strict=True):
        clock.now += seconds  # 3 Mpx a second in equal shares: 6 Mpx each in 6 s, ...
        pace.ended(token, True)
        if token == tokens[0]:
            assert pace._read.done / pace._read.seconds == pytest.approx(3e6, rel=0.01)
    # The last was shared for all but the last third of a second of its 7 s: its work is
    # counted by that part of its seconds, a little over the 7 Mpx it had while shared
    # (alone, a request gets through more a second).
    assert pace._read.done / pace._read.seconds == pytest.approx(3e6, rel=0.1)


def test_only_shared_time_reads_the_pace_and_failures_prove_no_work(clock: Clock) -> None:
    pace = Pace()
    _shared(pace, clock, 1_000_000, 0.5, 12)
    for _ in range(3):  # one at a time, 1 Mpx a second: not the pipeline's pace
        token = pace.started(1_000_000)
        clock.now += 1.0
        pace.ended(token, True)
        clock.now += 0.5  # idle
    assert pace.expected_s(1_000_000) == pytest.approx(0.5, rel=0.02)
    _shared(pace, clock, 1_000_000, 1.0, 20, answered=False)  # ran out: busy, nothing done
    slowed = pace.expected_s(1_000_000)
    assert slowed is not None and slowed > 5.0


def test_a_pipeline_where_every_request_runs_out_is_read_as_never_in_time(clock: Clock) -> None:
    pace = Pace()
    _shared(pace, clock, 1, 0.25, 5, answered=False)
    assert pace.expected_s(1) == math.inf
    _shared(pace, clock, 1, 0.25, 1)  # one got through: a pace again
    expected = pace.expected_s(1)
    # The two answered had an eighth of a second each: alone they say 0.125 s a request.
    # The six late ones' 1.25 s of the pipeline (a little faded) still count: ~0.7 s.
    assert expected is not None and 0.5 < expected < 0.9


def test_what_was_measured_fades(clock: Clock) -> None:
    pace = Pace()
    _shared(pace, clock, 1, 1.0, 10)
    clock.now += 60  # a minute without requests: the old pace is forgotten
    assert pace.expected_s(1) is None
    _shared(pace, clock, 1, 0.05, 40)  # the services got faster
    assert pace.expected_s(1) == pytest.approx(0.05, rel=0.1)


def test_requests_that_cost_little_are_never_refused_but_one_waiting_for_room_is_judged(
    clock: Clock,
) -> None:
    """A refusal on arrival saves nothing where requests cost ~1 ms. One waiting for room
    is judged all the same: not judged, 6000x6000 photos sent to `digits` after its small
    ones waited out their 3 s and were let in to time out in the preprocessing."""
    pace = Pace()
    _shared(pace, clock, 1_000, 0.001, 100)  # ~1 ms a request of 1,000 pixels, as digits
    for _ in range(50):
        pace.started(1_000)
    assert pace.expected_s(1_000) is None
    # 36 Mpx (a 6000x6000 photo) at a megapixel a second, behind 50 small ones.
    assert pace.queued_s(36_000_000, 0) == pytest.approx(36.05, rel=0.02)


async def _primed(clock: Clock, **kwargs: object) -> Admission:
    admission = Admission(100, 1 << 30, 1 << 28, **kwargs)  # type: ignore[arg-type]
    # A megapixel a second, as processor sharing serves it: four 1 Mpx requests in turn,
    # each in 2 s beside a 4 Mpx one that ends with the last.
    async with admission.admit("ocr", 4_000_000, left_s=100):
        for _ in range(4):
            async with admission.admit("ocr", 1_000_000, left_s=10):
                clock.now += 2.0
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
        assert info.value.retry_after == "1"
        # Told to come back when the work ahead would fit its budget, not a fixed second.
        with pytest.raises(Problem) as info:
            async with admission.admit("ocr", 1_000_000, left_s=0.4):
                pass
        assert info.value.retry_after == "3"  # ~3 s ahead, 0.4 s left: in 2.6 s
        assert _shed("ocr") == shed + 2
        pace = admission.room("ocr").pace
        read = pace._read
        rate = read.done / read.seconds
        before = (read.ended, read.seconds, read.done)
        # A failure in time (a bad image, a service's error) says nothing of the pace: what
        # was read only fades. Counted as answered, a page refused at its first step brought
        # its pixels in next to no time, and the pace read faster than the services are.
        with pytest.raises(ValueError):
            async with admission.admit("ocr", 1_000_000, left_s=3.5):
                clock.now += 3.0
                raise ValueError
        keep = 0.5 ** (3.0 / pace_module.HALF_LIFE_S)
        assert (read.ended, read.seconds, read.done) == pytest.approx([x * keep for x in before])
        done, busy = read.done, read.seconds
        with pytest.raises(TimeoutError):  # ran out of time: busy, and nothing got through
            async with admission.admit("ocr", 1_000_000, left_s=3.5):
                clock.now += 3.5
                raise TimeoutError
        # Its third of 3.5 s of the pipeline counted, with none of its work.
        keep = 0.5 ** (3.5 / pace_module.HALF_LIFE_S)
        slowed = read.done / read.seconds
        assert slowed == pytest.approx(done * keep / (busy * keep + 3.5 / 3), rel=0.01)
        assert slowed < rate * 0.9
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


def _shed(pipeline: str) -> float:
    return metrics.SHED.labels(pipeline)._value.get()


def test_the_first_end_is_the_least_work_left_at_an_equal_share(clock: Clock) -> None:
    pace = Pace()
    assert pace.next_end_s() is None  # nothing in flight, nothing answered
    _shared(pace, clock, 1_000_000, 0.5, 4)  # 2 Mpx a second while shared
    for work in (3_000_000, 1_000_000, 2_000_000):
        pace.started(work)
    # Three share 2 Mpx a second: the 1 Mpx one has its megapixel in 1.5 s.
    assert pace.next_end_s() == pytest.approx(1.5, rel=0.01)
    clock.now += 0.6  # 0.4 Mpx each since, at the pace kept: 0.6 Mpx left at a third
    assert pace.next_end_s() == pytest.approx(0.9, rel=0.01)


async def test_a_pipeline_at_its_limits_says_when_it_may_have_room(clock: Clock) -> None:
    """Its 503's Retry-After is when its first request in flight is expected to end: OCR
    pages told to come back in 1 s came back while three 7 Mpx pages needed ~7 s more."""
    # None may wait for room (max_queued=0): each is told when to come back.
    limits = {"ocr": PipelineLimits(max_pixels=6_000_000, max_in_flight=3, max_queued=0)}
    admission = await _primed(clock, pipelines=limits, shed_late=True)
    async with AsyncExitStack() as running:
        for _ in range(3):  # three 2 Mpx pages share a megapixel a second
            await running.enter_async_context(admission.admit("ocr", 2_000_000, left_s=60))
        for pixels in (1_000_000, 1):  # past its pixels, past its requests
            with pytest.raises(Problem) as info:
                async with admission.admit("ocr", pixels, left_s=60):
                    pass
            assert "at capacity" in info.value.message
            # 2 Mpx each at a third of ~1 Mpx/s (the pace as measured: a little under).
            assert info.value.retry_after in ("6", "7")
        # A pace read from little may say hours (one request stalled): told 30 s at most.
        admission.room("ocr").pace.next_end_s = lambda: 5000.0  # type: ignore[method-assign]
        with pytest.raises(Problem) as info:
            async with admission.admit("ocr", 1, left_s=60):
                pass
        assert info.value.retry_after == "30"  # MOST_WAIT_S


def test_a_pipeline_never_shared_is_read_one_request_at_a_time(clock: Clock) -> None:
    """A pipeline that runs one request at a time (`max_in_flight: 1`) never shares it:
    read only while shared, its pace was never known, so none could wait for room. Its
    requests one at a time say its pace for those that wait; arrivals are judged only
    while shared, and once it is shared, that pace is the one read."""
    pace = Pace()
    for _ in range(2):
        token = pace.started(1_000_000)
        clock.now += 1.0  # a megapixel a second
        pace.ended(token, True)
    assert pace.known and pace.expected_s(1_000_000) is None
    token = pace.started(1_000_000)
    clock.now += 0.25
    # The rest of the one in flight, a megapixel waiting ahead, then its own.
    assert pace.queued_s(1_000_000, 1_000_000) == pytest.approx(2.75, rel=0.01)
    assert pace.next_end_s() == pytest.approx(0.75, rel=0.01)
    clock.now += 0.75
    pace.ended(token, True)
    _shared(pace, clock, 1_000_000, 0.25, 4)  # 4 Mpx a second while shared
    assert pace.queued_s(1_000_000, 0) == pytest.approx(0.25, rel=0.05)


async def test_a_pipeline_that_runs_one_at_a_time_lets_requests_wait_at_its_pace(
    clock: Clock,
) -> None:
    limits = {"ocr": PipelineLimits(max_in_flight=1)}
    admission = Admission(100, 1 << 30, 1 << 28, pipelines=limits)
    room = admission.room("ocr")

    async def later(left_s: float) -> None:
        async with admission.admit("ocr", 1_000_000, left_s=left_s):
            pass

    async with admission.admit("ocr", 1_000_000, left_s=10):
        clock.now += 1.0  # alone: a megapixel a second
    async with admission.admit("ocr", 1_000_000, left_s=10):
        with pytest.raises(Problem) as info:  # the megapixel in flight, then its own
            await later(1.5)
        assert info.value.status == 503 and "~2.00 s of work ahead" in info.value.message
        waiting = asyncio.ensure_future(later(10))
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(room.line) == 1 and not waiting.done()
        clock.now += 1.0
    await asyncio.wait_for(waiting, 5)
    assert (room.in_flight, len(room.line)) == (0, 0)
