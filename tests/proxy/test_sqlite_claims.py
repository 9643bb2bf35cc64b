"""An idle process's loops over the SQLite queue: one of them looks for other processes' jobs
every POLL_S, not each of them; a claim that finds a job wakes the others, so that a burst
submitted elsewhere is taken by every idle loop at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from proxy.jobs import sqlite_queue
from proxy.jobs.model import Submission
from proxy.jobs.queue import open_queue

LOOPS = 4


def job(payload: bytes) -> Submission:
    return Submission("p", "image", payload, 3, 1000.0)


async def test_an_idle_process_looks_once_a_poll_not_once_a_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims: list[float] = []
    claim = sqlite_queue.sql.claim
    monkeypatch.setattr(
        sqlite_queue.sql, "claim", lambda *a: claims.append(time.monotonic()) or claim(*a)
    )
    queue = open_queue(f"sqlite:///{tmp_path / 'jobs.sqlite3'}", keep_s=60)
    stop = time.monotonic() + 2.0

    async def idle_loop() -> None:  # as a worker's loop: a claim of a second, again
        while time.monotonic() < stop:
            assert await queue.claim(lease_s=30, wait_s=1.0) is None

    try:
        started = time.monotonic()
        await asyncio.gather(*(idle_loop() for _ in range(LOOPS)))
        elapsed = time.monotonic() - started
    finally:
        await queue.close()
    # One loop every POLL_S, each of the others once a claim's second (each loop looking
    # every POLL_S made LOOPS times the first term).
    most = elapsed / sqlite_queue.POLL_S + LOOPS * (elapsed + 2)
    assert len(claims) <= most, (len(claims), most)


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
