"""Admission: requests, bytes and, per pipeline, requests and megapixels in flight."""

from __future__ import annotations

import pytest

from proxy.engine.admission import Admission, PipelineLimits
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
