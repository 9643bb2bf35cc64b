"""Admission: requests, bytes and, per pipeline, requests and megapixels in flight."""

from __future__ import annotations

import asyncio

import pytest

from proxy.engine.admission import Admission, PipelineLimits
from proxy.engine.pace import PixelPace
from proxy.errors import Problem


async def test_a_pipelines_megapixels_bound_what_it_takes() -> None:
    admission = Admission(100, 1 << 30, 1 << 28, {"ocr": PipelineLimits(max_pixels=10_000_000)})
    async with admission.admit("ocr", 9_000_000):
        with pytest.raises(Problem) as info:
            async with admission.admit("ocr", 2_000_000):
                pass
        assert info.value.status == 503 and "9.0 of 10 megapixels" in info.value.message
        async with admission.admit("ocr", 1_000_000):  # still fits
            pass
        async with admission.admit("digits", 50_000_000):  # another pipeline: no limit
            pass
    async with admission.admit("ocr", 40_000_000):  # alone, larger than the budget: passes
        pass


async def test_requests_in_flight_per_pipeline_and_overall() -> None:
    admission = Admission(2, 1 << 30, 1 << 28, {"ocr": PipelineLimits(max_in_flight=1)})
    async with admission.admit("ocr", 0):
        with pytest.raises(Problem, match="pipeline 'ocr' at capacity"):
            async with admission.admit("ocr", 0):
                pass
        async with admission.admit("digits", 0):
            with pytest.raises(Problem, match="proxy at capacity \\(2 requests"):
                async with admission.admit("digits", 0):
                    pass
    async with admission.admit("ocr", 0):  # released
        pass


def test_bytes_in_flight_shed_new_requests_and_cap_one() -> None:
    admission = Admission(10, 100, 60)
    first, second = admission.ledger(), admission.ledger()
    first.hold(60)
    with pytest.raises(Problem) as info:
        first.hold(1)
    assert info.value.status == 413
    second.hold(50)
    with pytest.raises(Problem, match="MiB of requests in flight"):
        admission.check_room()
    first.close()
    admission.check_room()
    assert admission.bytes_in_flight == 50


def test_a_pipelines_pace_is_pixels_answered_per_busy_second() -> None:
    pace = PixelPace()
    assert pace.rate() is None
    pace.started(now=10.0)
    pace.started(now=10.0)
    pace.ended(4_000_000, answered=True, now=12.0)  # two at once: busy 2 s, 4 Mpx
    pace.ended(4_000_000, answered=True, now=14.0)  # busy 4 s, 8 Mpx
    assert pace.rate() == pytest.approx(2_000_000)
    # Idle time is not the pipeline's pace; work cancelled midway earns nothing.
    pace.started(now=100.0)
    pace.ended(9_000_000, answered=False, now=101.0)
    assert pace.rate() == pytest.approx(8_000_000 / 4)  # the window's busy span: answers only
    pace.started(now=200.0)
    pace.ended(2_000_000, answered=True, now=201.0)
    assert pace.rate() == pytest.approx(10_000_000 / 6)
    assert pace.seconds_for(5_000_000) == pytest.approx(3.0)


async def test_a_request_the_pipeline_would_not_answer_in_time_is_refused_at_once() -> None:
    """At the pace it keeps (here 1 Mpx/s), a pipeline with 9 Mpx in flight does not take a
    page of 9 more with 15 s left, well within its fixed limit of 32; it does with 20 s left,
    and it takes anything when idle."""
    admission = Admission(100, 1 << 30, 1 << 28, {"ocr": PipelineLimits(max_pixels=32_000_000)})
    async with admission.admit("ocr", 1_000_000, left_s=15):
        await asyncio.sleep(0.05)  # 1 Mpx in ~0.05 s: fast
    async with admission.admit("ocr", 9_000_000, left_s=15):
        # The pace now: ~10 Mpx in ~0.05 s. Slow it to a known 1 Mpx/s.
        admission._paces["ocr"] = slow = PixelPace()
        slow.started(now=0.0)
        slow.ended(5_000_000, answered=True, now=5.0)
        slow.started()
        with pytest.raises(Problem) as info:
            async with admission.admit("ocr", 9_000_000, left_s=15):
                pass
        assert info.value.status == 503 and "would not answer in time" in info.value.message
        assert "18.0 megapixels" in info.value.message
        async with admission.admit("ocr", 9_000_000, left_s=20):
            pass
        async with admission.admit("ocr", 9_000_000, left_s=None):  # a job waits its turn
            pass
    async with admission.admit("ocr", 30_000_000, left_s=1):  # idle: taken
        pass
