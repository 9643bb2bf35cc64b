"""The jobs' workers over a queue that fails: said once, not once a loop a second, and never
a loop lost to an error."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from proxy.jobs.model import JobsConfig, QueueError
from proxy.jobs.queue import open_queue
from proxy.jobs.workers import Workers


async def test_workers_say_once_that_the_queue_is_unreachable_and_when_it_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Each loop tries again every second: 8 workers logged 8 lines a second while Redis was
    # down.
    real = open_queue(f"sqlite:///{tmp_path / 'jobs.sqlite3'}", keep_s=60)
    refusals = iter(range(12))  # three claims of each of four loops

    class Unreachable:
        def __getattr__(self, name: str):
            return getattr(real, name)

        async def claim(self, lease_s: float, wait_s: float):
            if next(refusals, None) is not None:
                raise QueueError("redis redis://127.0.0.1:6380/1: ConnectionError: refused")
            return await real.claim(lease_s, wait_s)

    config = JobsConfig(
        f"sqlite:///{tmp_path / 'jobs.sqlite3'}", 4, 10, 0, 60, 30, 3, 0.5, frozenset()
    )
    workers = Workers(Unreachable(), None, config, None)  # type: ignore[arg-type]
    workers.start()
    try:
        for _ in range(100):
            if "the queue answers again" in caplog.text:
                break
            await asyncio.sleep(0.1)
    finally:
        await workers.stop()
        await real.close()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("jobs:")]
    assert said == ["jobs: the queue cannot be reached", "jobs: the queue answers again"]


async def test_a_workers_loop_outlives_an_unexpected_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    real = open_queue(f"sqlite:///{tmp_path / 'jobs.sqlite3'}", keep_s=60)
    claims = 0

    class Broken:
        def __getattr__(self, name: str):
            return getattr(real, name)

        async def claim(self, lease_s: float, wait_s: float):
            nonlocal claims
            claims += 1
            if claims == 1:
                raise RuntimeError("a bug")
            return await real.claim(lease_s, 0.05)

    config = JobsConfig(
        f"sqlite:///{tmp_path / 'jobs.sqlite3'}", 1, 10, 0, 60, 30, 3, 0.5, frozenset()
    )
    workers = Workers(Broken(), None, config, None)  # type: ignore[arg-type]
    workers.start()
    try:
        for _ in range(50):
            if claims >= 3:
                break
            await asyncio.sleep(0.1)
    finally:
        await workers.stop()
        await real.close()
    assert claims >= 3  # the one loop claimed again after the error
    assert "a worker's claim failed" in caplog.text and "a bug" in caplog.text
