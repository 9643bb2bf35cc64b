"""The jobs' workers over a queue that fails: said once, not once a loop a second, and never
a loop lost to an error; callbacks that outlive the process that ended their jobs, and a
receiver that is down for a while."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.jobs.model import JobsConfig, QueueError, Submission
from proxy.jobs.queue import JobQueue, open_queue
from proxy.jobs.workers import Workers
from tests.callbacks import callbacks_received


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
    from proxy.jobs.service import Jobs

    with callbacks_received() as hook:
        received = hook.bodies
        url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
        hosts = frozenset({hook.host})
        config = JobsConfig(url, 0, 10, 0, 60, 30, 3, 0.5, hosts)
        jobs = Jobs(None, config)  # type: ignore[arg-type]  # no workers: no engine needed
        real, reads = jobs.queue, 0

        class Stalled(Failing):
            async def get(self, job_id: str):
                nonlocal reads
                reads += 1
                if reads <= 2:
                    raise QueueError("redis redis://127.0.0.1:6380/1: TimeoutError")
                return await real.get(job_id)

        jobs.queue = jobs.outbox.queue = Stalled(real, lambda: None)  # type: ignore[assignment]
        jobs.start()
        try:
            job, _ = await jobs.submit(Submission("p", "image", b"x", 3, 1000.0, callback=hook.url))
            _, ended = await jobs.cancel(job.id)
            for _ in range(100):
                if received:
                    break
                await asyncio.sleep(0.05)
        finally:
            await jobs.stop()
    assert ended and reads == 3  # two reads refused, the third taken
    assert [(r["id"], r["status"]) for r in received] == [(job.id, "cancelled")]


async def wait_for(check: Callable[[], bool], seconds: float = 15.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)


async def test_callbacks_go_though_the_process_that_ended_their_jobs_is_gone(jobs_url: str) -> None:
    """Two callbacks nobody was left to send: a job whose end was written by a process that
    died before its callback went, and one failed by another worker's claim because its own
    worker died on its last attempt (that one was never sent before the outbox). Another
    process running workers sends both."""
    from proxy.jobs.service import Jobs

    with callbacks_received() as receiver:
        received, hook = receiver.bodies, receiver.url
        gone = open_queue(jobs_url, keep_s=60, callback_hold_s=0.5)
        ended, _ = await gone.submit(Submission("p", "image", b"a", 3, 1000.0, callback=hook), 10)
        claimed = await gone.claim(lease_s=10.0, wait_s=0.5)
        assert claimed is not None and await gone.finish(claimed, "succeeded", {"r": 1}, None, 60)
        dead, _ = await gone.submit(Submission("p", "image", b"b", 1, 1000.0, callback=hook), 10)
        assert await gone.claim(lease_s=0.5, wait_s=0.5) is not None  # its worker then dies
        await gone.close()
        hosts = frozenset({receiver.host})
        config = JobsConfig(jobs_url, 1, 10, 0, 60, 30, 3, 0.5, hosts, callback_hold_s=0.5)
        jobs = Jobs(None, config)  # type: ignore[arg-type]  # nothing to run: no engine
        jobs.start()
        try:
            await wait_for(lambda: len(received) >= 2)
            await asyncio.sleep(1.5)  # time for a callback sent twice to show
            shown = [await jobs.get(ended.id), await jobs.get(dead.id)]
        finally:
            await jobs.stop()
    assert sorted((r["id"], r["status"]) for r in received) == sorted(
        [(ended.id, "succeeded"), (dead.id, "failed")]
    )
    assert [j.callback_status if j else None for j in shown] == ["delivered", "delivered"]


async def test_a_callback_outlasts_a_receiver_down_past_its_first_tries(
    jobs_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six failed tries: before the outbox, the last one (~15 s after the job's end); then
    no more. Now it goes on, the waits growing, until delivered."""
    from proxy.jobs import outbox
    from proxy.jobs.service import Jobs

    monkeypatch.setattr(outbox, "LOOK_S", 0.05)
    with callbacks_received(failures=6) as receiver:
        received, hosts = receiver.bodies, frozenset({receiver.host})
        config = JobsConfig(
            jobs_url, 1, 10, 0, 60, 30, 3, 0.5, hosts, callback_first_s=0.05, callback_most_s=0.4
        )
        jobs = Jobs(None, config)  # type: ignore[arg-type]  # nothing to run: no engine
        jobs.start()
        seen: list[str | None] = []
        try:
            hook = receiver.url
            job, _ = await jobs.submit(Submission("p", "image", b"x", 3, 1000.0, callback=hook))
            await jobs.cancel(job.id)
            for _ in range(400):
                shown = await jobs.get(job.id)
                assert shown is not None
                if shown.callback_status not in seen:
                    seen.append(shown.callback_status)
                if shown.callback_status == "delivered":
                    break
                await asyncio.sleep(0.025)
        finally:
            await jobs.stop()
    assert [r["id"] for r in received] == [job.id] * 7
    assert seen[-2:] == ["retrying: HTTP 500", "delivered"]


async def test_callbacks_take_turns_within_a_bound(
    jobs_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver that answers slowly: every job ended at once had its own try under way
    (thousands of tasks and connections while a receiver hung); now at most IN_FLIGHT, the
    others waiting their turn, all delivered."""
    from proxy.jobs import outbox
    from proxy.jobs.service import Jobs

    monkeypatch.setattr(outbox, "IN_FLIGHT", 3)
    with callbacks_received(delay_s=0.2) as receiver:
        config = JobsConfig(jobs_url, 0, 100, 0, 60, 30, 3, 0.5, frozenset({receiver.host}))
        jobs = Jobs(None, config)  # type: ignore[arg-type]  # nothing to run: no engine
        jobs.start()
        try:
            submitted = [
                (await jobs.submit(Submission("p", "image", bytes([i]), 3, 1e3, receiver.url)))[0]
                for i in range(12)
            ]
            for job in submitted:
                await jobs.cancel(job.id)
            await wait_for(lambda: len(receiver.taken) == len(submitted))
        finally:
            await jobs.stop()
    assert set(receiver.taken) == {(job.id, "cancelled") for job in submitted}
    assert receiver.most_at_once == 3 and set(receiver.taken.values()) == {1}


async def test_a_callback_taken_again_as_its_try_ends_is_not_sent_again(
    jobs_url: str,
) -> None:
    """A look reads a callback due (its hold ran out while its try was slow: the POST, then
    the write of how it went, behind a busy store) and hands it over once that try has
    ended: the second try must find it delivered and send nothing. CI saw two callbacks
    sent twice by one process so."""
    from proxy.jobs.service import Jobs

    with callbacks_received() as receiver:
        config = JobsConfig(jobs_url, 0, 100, 0, 60, 30, 3, 0.5, frozenset({receiver.host}))
        jobs = Jobs(None, config)  # type: ignore[arg-type]  # nothing to run: no engine
        jobs.start()
        try:
            job, _ = await jobs.submit(Submission("p", "image", b"x", 3, 1e3, receiver.url))
            await jobs.cancel(job.id)
            await wait_for(lambda: len(receiver.taken) == 1)
            await wait_for(lambda: not jobs.outbox._trying)  # its outcome written
            jobs.outbox.send(job.id)  # what the late look does
            await wait_for(lambda: not jobs.outbox._trying)
            shown = await jobs.get(job.id)
        finally:
            await jobs.stop()
    assert receiver.taken == {(job.id, "cancelled"): 1} and len(receiver.bodies) == 1
    assert shown is not None and shown.callback_status == "delivered"


async def test_a_callback_to_a_host_no_longer_allowed_is_refused_not_sent(
    jobs_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator takes a host off PROXY_JOBS_CALLBACK_HOSTS (abused, or gone) and restarts:
    callbacks accepted before, still waiting (a receiver down), went on to it. Checked again
    when sent, each is refused, final, naming why, and the receiver hears nothing more."""
    from proxy.jobs import outbox
    from proxy.jobs.service import Jobs

    monkeypatch.setattr(outbox, "LOOK_S", 0.05)
    with callbacks_received(failures=1000) as receiver:
        allowed = frozenset({receiver.host})
        settings = (jobs_url, 1, 10, 0, 60, 30, 3, 0.5)
        before = Jobs(None, JobsConfig(*settings, allowed, callback_first_s=0.05))  # type: ignore[arg-type]
        before.start()
        try:
            job, _ = await before.submit(
                Submission("p", "image", b"x", 3, 1000.0, callback=receiver.url)
            )
            await before.cancel(job.id)
            for _ in range(200):  # tried and failed: waiting for its next try
                if len(receiver.bodies) >= 2:
                    break
                await asyncio.sleep(0.025)
        finally:
            await before.stop()
        tried = len(receiver.bodies)
        assert tried >= 2
        after = Jobs(None, JobsConfig(*settings, frozenset(), callback_first_s=0.05))  # type: ignore[arg-type]
        after.start()
        try:
            for _ in range(200):
                shown = await after.get(job.id)
                assert shown is not None
                if shown.callback_status and shown.callback_status.startswith("refused"):
                    break
                await asyncio.sleep(0.025)
            await asyncio.sleep(0.3)  # several looks more: nothing goes
        finally:
            await after.stop()
    assert (
        shown.callback_status is not None and "PROXY_JOBS_CALLBACK_HOSTS" in shown.callback_status
    )
    assert len(receiver.bodies) == tried
