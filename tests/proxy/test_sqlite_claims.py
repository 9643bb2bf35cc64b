"""An idle process's loops over the SQLite queue: one of them looks for other processes' jobs
every POLL_S, not each of them; a claim that finds a job wakes the others, so that a burst
submitted elsewhere is taken by every idle loop at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from proxy.jobs import sqlite_queue
from proxy.jobs.model import Claimed, JobsConfig, Submission
from proxy.jobs.queue import open_queue
from proxy.jobs.running import Outcome
from proxy.jobs.workers import Workers

LOOPS = 4


def job(payload: bytes) -> Submission:
    return Submission("p", "image", payload, 3, 1000.0)


async def test_idle_workers_look_once_a_poll_and_stop_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four idle worker loops over SQLite for 2 s: one looks every POLL_S, the others only
    when woken (each looked on its own: 48 looks; then twice a second each besides the
    poller: 24; now 10 and their first four). Their stop ends every idle claim at once,
    though a claim waits 30 s for a job: none of the loops is cancelled."""
    claims: list[float] = []
    claim = sqlite_queue.sql.claim
    monkeypatch.setattr(
        sqlite_queue.sql, "claim", lambda *a: claims.append(time.monotonic()) or claim(*a)
    )
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    queue = open_queue(url, keep_s=60)
    config = JobsConfig(url, LOOPS, 10, 0, 60, 30, 3, 0.5, frozenset())
    workers = Workers(queue, None, config, None)  # type: ignore[arg-type]
    ran: list[str] = []

    async def attempt(claimed: Claimed) -> Outcome:
        ran.append(claimed.job.id)
        return Outcome(result={"ok": True})

    async def ended(job: object) -> None:
        pass

    again = Workers(queue, attempt, config, ended)
    try:
        started = time.monotonic()
        workers.start()
        await asyncio.sleep(2.0)
        idle = time.monotonic() - started
        looks = len(claims)
        await workers.stop()
        stopped = [t for t in workers._tasks if not t.cancelled()]
        again.start()  # workers started again over the same queue wait for jobs and run them
        submitted, _ = await queue.submit(job(b"after"), 100)
        for _ in range(100):
            if ran:
                break
            await asyncio.sleep(0.05)
        await again.stop()
    finally:
        await queue.close()
    assert looks <= idle / sqlite_queue.POLL_S + LOOPS + 2, looks
    assert len(stopped) == len(workers._tasks), "idle loops were cancelled, not stopped"
    assert ran == [submitted.id]


async def test_a_burst_from_another_process_is_taken_by_every_idle_loop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    here, elsewhere = open_queue(url, keep_s=60), open_queue(url, keep_s=60)
    try:
        # Idle loops whose claims would wait 30 s unless woken: only one looks every POLL_S.
        waiting = [asyncio.create_task(here.claim(lease_s=30, wait_s=30)) for _ in range(LOOPS)]
        await asyncio.sleep(0.5)
        submitted = [(await elsewhere.submit(job(bytes([i])), 100))[0].id for i in range(LOOPS)]
        done, _ = await asyncio.wait(waiting, timeout=10)
        claimed = {t.result().job.id for t in done if t.result() is not None}
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        await here.close()
        await elsewhere.close()
    assert claimed == set(submitted)
