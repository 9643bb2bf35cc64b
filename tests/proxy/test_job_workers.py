"""The jobs' workers over a queue that fails: said once, not once a loop a second, and never
a loop lost to an error."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.jobs.model import JobsConfig, QueueError
from proxy.jobs.queue import JobQueue, open_queue
from proxy.jobs.workers import Workers


class Failing:
    """A real queue whose claims first go through `before` (which raises for a failure)."""

    def __init__(self, real: JobQueue, before: Callable[[], None]) -> None:
        self._real, self._before = real, before

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    async def claim(self, lease_s: float, wait_s: float):
        self._before()
        return await self._real.claim(lease_s, min(wait_s, 0.05))


async def run_until(path: Path, workers: int, before: Callable[[], None], done) -> None:
    """`workers` loops over a Failing queue in `path` until `done()` (10 s at most)."""
    real = open_queue(f"sqlite:///{path}", keep_s=60)
    config = JobsConfig(f"sqlite:///{path}", workers, 10, 0, 60, 30, 3, 0.5, frozenset())
    running = Workers(Failing(real, before), None, config, None)  # type: ignore[arg-type]
    running.start()
    try:
        for _ in range(100):
            if done():
                break
            await asyncio.sleep(0.1)
    finally:
        await running.stop()
        await real.close()


async def test_workers_say_once_that_the_queue_is_unreachable_and_when_it_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Each loop tries again every second: 8 workers logged 8 lines a second while Redis was
    # down.
    refusals = iter(range(12))  # three claims of each of four loops

    def refuse() -> None:
        if next(refusals, None) is not None:
            raise QueueError("redis redis://127.0.0.1:6380/1: ConnectionError: refused")

    await run_until(
        tmp_path / "jobs.sqlite3", 4, refuse, lambda: "the queue answers again" in caplog.text
    )
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("jobs:")]
    assert said == ["jobs: the queue cannot be reached", "jobs: the queue answers again"]


async def test_a_workers_loop_outlives_an_unexpected_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    claims = 0

    def first_fails() -> None:
        nonlocal claims
        claims += 1
        if claims == 1:
            raise RuntimeError("a bug")

    await run_until(tmp_path / "jobs.sqlite3", 1, first_fails, lambda: claims >= 3)
    assert claims >= 3  # the one loop claimed again after the error
    assert "a worker's loop failed" in caplog.text and "a bug" in caplog.text


async def test_a_final_state_the_store_could_not_take_is_written_again(tmp_path: Path) -> None:
    # A final write lost to a stalled store left the job to run again once its lease ran out
    # (30 s later, the model run twice).
    from proxy.jobs.model import Submission
    from proxy.jobs.running import Outcome

    path = tmp_path / "jobs.sqlite3"
    real = open_queue(f"sqlite:///{path}", keep_s=60)
    submitted, _ = await real.submit(Submission("p", "image", b"x", 3, 1000.0), 10)
    finishes, runs = 0, 0

    class Stalled(Failing):
        async def finish(self, *args):
            nonlocal finishes
            finishes += 1
            if finishes <= 2:
                raise QueueError("the jobs' database: database is locked")
            return await real.finish(*args)

    async def attempt(claimed) -> Outcome:
        nonlocal runs
        runs += 1
        return Outcome(result={"label": 7})

    async def ended(job) -> None:
        pass

    config = JobsConfig(f"sqlite:///{path}", 1, 10, 0, 60, 30, 3, 0.5, frozenset())
    workers = Workers(Stalled(real, lambda: None), attempt, config, ended)  # type: ignore[arg-type]
    workers.start()
    try:
        for _ in range(100):
            job = await real.get(submitted.id)
            if job is not None and job.status == "succeeded":
                break
            await asyncio.sleep(0.1)
    finally:
        await workers.stop()
    job = await real.get(submitted.id)
    await real.close()
    assert job is not None and job.status == "succeeded" and job.result == {"label": 7}
    assert (runs, finishes, job.attempts) == (1, 3, 1)  # written on its third try, run once


async def test_a_callback_waits_out_a_store_that_cannot_be_read_yet(tmp_path: Path) -> None:
    # The callback's read of the ended job ran on the worker's own path: a store that stalled
    # right after a job's end lost its callback (3 of 300 through a 12 s Redis stall) and
    # ended the worker's loop with it.
    from proxy.jobs.model import Submission
    from proxy.jobs.service import Jobs
    from tests.proxy.test_jobs import receiver

    async with receiver(failures=0) as (port, received):
        url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
        hosts = frozenset({f"127.0.0.1:{port}"})
        config = JobsConfig(url, 0, 10, 0, 60, 30, 3, 0.5, hosts, callback_backoff_s=(0.1,) * 3)
        jobs = Jobs(None, config)  # type: ignore[arg-type]  # no workers: no engine needed
        real, reads = jobs.queue, 0

        class Stalled(Failing):
            async def get(self, job_id: str):
                nonlocal reads
                reads += 1
                if reads <= 2:
                    raise QueueError("redis redis://127.0.0.1:6380/1: TimeoutError")
                return await real.get(job_id)

        jobs.queue = Stalled(real, lambda: None)  # type: ignore[assignment]
        jobs.start()
        try:
            callback = f"http://127.0.0.1:{port}/done"
            job, _ = await jobs.submit(Submission("p", "image", b"x", 3, 1000.0, callback=callback))
            _, ended = await jobs.cancel(job.id)
            for _ in range(100):
                if received:
                    break
                await asyncio.sleep(0.05)
        finally:
            await jobs.stop()
    assert ended and reads == 3  # two reads refused, the third taken
    assert [(r["id"], r["status"]) for r in received] == [(job.id, "cancelled")]
