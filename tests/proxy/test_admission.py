"""Admission: requests, bytes and, per pipeline, requests and megapixels in flight."""

from __future__ import annotations

import asyncio

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


async def test_jobs_run_one_at_a_time_while_clients_wait_and_widen_once_quiet() -> None:
    """The services' cores are shared: while requests whose clients wait are served (and for
    `quiet_s` after), jobs take turns; a process with no such clients runs them side by side."""
    admission = Admission(100, 1 << 30, 1 << 28, busy_background=1, quiet_s=0.2)
    # No client waiting: jobs side by side.
    await asyncio.wait_for(admission.wait_background("ocr", 0, 0.5), 1)
    await asyncio.wait_for(admission.wait_background("ocr", 0, 0.5), 1)
    admission.background_done("ocr", 0)
    admission.background_done("ocr", 0)

    loop = asyncio.get_running_loop()
    async with admission.admit("digits", 0):  # a client waiting
        await admission.wait_background("ocr", 0, 0.5)  # the first job still runs
        waiting = asyncio.ensure_future(admission.wait_background("ocr", 0, 0.5))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # a second one waits its turn
        admission.background_done("ocr", 0)
        await asyncio.wait_for(waiting, 1)  # its turn: the first ended
        third = asyncio.ensure_future(admission.wait_background("ocr", 0, 0.5))
        await asyncio.sleep(0.3)
        assert not third.done()
    quiet = loop.time()
    await asyncio.wait_for(third, 2)  # the client gone for quiet_s: side by side again
    assert loop.time() - quiet >= 0.15
    assert admission._background["ocr"][0] == 2


def test_an_upload_is_refused_once_it_would_pass_the_bytes_in_flight() -> None:
    """Requests that start together each find room when they start (check_room); their
    uploads, counted as they arrive, are refused once the proxy would pass its bound: 503
    (the rest of the body is dropped unread)."""
    admission = Admission(10, 100, 80)
    first, second = admission.ledger(), admission.ledger()
    admission.check_room()  # both started with room
    first.hold_upload(60)
    second.hold_upload(40)  # exactly the bound: taken
    with pytest.raises(Problem) as info:
        second.hold_upload(1)
    assert info.value.status == 503 and not info.value.close  # the rest is dropped unread
    assert "MiB of requests in flight" in info.value.message
    assert admission.bytes_in_flight == 100  # never more than the bound
    first.close()
    second.hold_upload(40)  # room again once a request ends
    with pytest.raises(Problem) as info:
        second.hold_upload(1)  # past its own bound (80): 413, as before
    assert info.value.status == 413
    second.close()
    alone = Admission(10, 100, 1000).ledger()
    alone.hold_upload(150)  # larger than the bound, but alone: passes (as a big image does)
    with pytest.raises(Problem, match="MiB of requests in flight"):
        Admission.ledger(alone.admission).hold_upload(1)  # while it holds them, none else
