"""The workers that run jobs: a bounded number of tasks, in the proxy or in a worker-only
process (python -m proxy.job_worker), each taking the oldest job due, running it as a background
request (it waits for room within its share rather than taking room from waiting
clients), and writing its one final state.

Leases: while a job runs, its worker renews its lease (every `renew_s`); a job it no longer
holds (cancelled, or taken by another worker after a stall outlived the lease) has its run
cancelled, its calls with it. A worker killed mid-job renews nothing: its lease runs out
and another worker takes the job again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from functools import partial

from proxy import metrics
from proxy.jobs.model import Claimed, Job, JobsConfig, QueueError
from proxy.jobs.queue import JobQueue, persisting
from proxy.jobs.running import Outcome

log = logging.getLogger("proxy")


SWEEP_S = 60.0
"""How often ended jobs past their time to keep are removed."""
SAY_AGAIN_S = 30.0
"""How often a queue that stays unreachable is said again."""
SWEEP_STEP = 500
"""Jobs removed in one step of a sweep. A sweep of 500,000 ended jobs in one step held
SQLite's write lock for 18 s (every submission, claim and read of the process waited, and
other processes' ran out of their busy timeout); in steps (~50 ms each for SQLite here), the
rest goes on in between."""


Attempt = Callable[[Claimed], Awaitable[Outcome]]
Finished = Callable[[Job], Awaitable[None]]


class Workers:
    def __init__(
        self, queue: JobQueue, attempt: Attempt, config: JobsConfig, finished: Finished
    ) -> None:
        self.queue = queue
        self.attempt = attempt
        self.config = config
        self.finished = finished
        """Called with a job (as claimed) once its final state is written (its callback)."""
        self._held: dict[str, tuple[str, asyncio.Task[Outcome]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._stopped = asyncio.Event()
        self._holding = asyncio.Event()
        """Some job is held here: the renewals' loop wakes only then."""
        self._down_since = 0.0
        """When the queue stopped answering the loops' claims (0: it answers)."""
        self._said = 0.0

    def start(self) -> None:
        self.queue.allow_claims()  # a queue whose earlier workers stopped
        loops = [self._loop() for _ in range(self.config.workers)]
        self._tasks = [asyncio.create_task(c) for c in (*loops, self._renew(), self._sweep())]

    async def stop(self) -> None:
        """Jobs running here go back to the queue at once (not after their lease). Every
        task ends between two calls to the store (a call cut short could leave a
        connection half used), or is cancelled after a few seconds."""
        self._stopping = True
        self._stopped.set()
        self._holding.set()
        self.queue.stop_claims()  # idle loops waiting for a job see the stop at once
        for _, task in self._held.values():
            task.cancel()
        if self._tasks:  # an idle loop sees `_stopping` once stop_claims ends its claim
            await asyncio.wait(self._tasks, timeout=3.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _pause(self, seconds: float) -> bool:
        """Wait `seconds`; False when the workers stop meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)
        return not self._stopping

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await self._next()
            except QueueError as exc:
                self._unreachable(exc)
                await self._pause(1.0)
            except Exception:  # a loop that died would leave its jobs to the others, unsaid
                log.exception("jobs: a worker's loop failed")
                await self._pause(1.0)

    async def _next(self) -> None:
        """One job claimed and run (or none within the queue's claim_wait_s)."""
        claimed = await self.queue.claim(self.config.lease_s, wait_s=self.queue.claim_wait_s)
        if self._down_since:
            log.warning("jobs: the queue answers again")
            self._down_since = 0.0
        if claimed is not None and self._stopping:
            await self._write(partial(self.queue.requeue, claimed, _STOPPED, 0.0))
        elif claimed is not None:
            await self._run(claimed)

    def _unreachable(self, exc: QueueError) -> None:
        """Said once for all the loops, and again every SAY_AGAIN_S while it lasts (every
        loop tries again each second: 8 lines a second before)."""
        now = time.monotonic()
        if not self._down_since or now - self._said >= SAY_AGAIN_S:
            self._said = now
            self._down_since = self._down_since or now
            log.warning(
                "jobs: the queue cannot be reached",
                extra={"fields": {"error": str(exc), "for_s": round(now - self._down_since)}},
            )

    async def _run(self, claimed: Claimed) -> None:
        job = claimed.job
        metrics.JOB_ATTEMPTS.labels(job.pipeline).inc()
        task = asyncio.create_task(self.attempt(claimed))
        self._held[job.id] = (claimed.token, task)
        self._holding.set()
        try:
            outcome = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                task.cancel()
            if self._stopping:
                await self._write(partial(self.queue.requeue, claimed, _STOPPED, 0.0))
            return
        finally:
            self._held.pop(job.id, None)
            if not self._held:
                self._holding.clear()
        if outcome.result is not None:
            await self._final(claimed, "succeeded", outcome)
        elif outcome.retryable and job.attempts < job.max_attempts:
            delay = min(self.config.backoff_s * 2 ** (job.attempts - 1), 60.0)
            delay *= 0.5 + random.random() / 2
            await self._write(partial(self.queue.requeue, claimed, outcome.error, delay))
        else:
            await self._final(claimed, "failed", outcome)

    async def _final(self, claimed: Claimed, status: str, outcome: Outcome) -> None:
        result, error, keep_s = outcome.result, outcome.error, self.config.keep_s
        finish = partial(self.queue.finish, claimed, status, result, error, keep_s)
        written = await self._write(finish)
        if written:
            metrics.JOBS_FINISHED.labels(claimed.job.pipeline, status).inc()
            await self.finished(claimed.job)

    async def _write(self, change: Callable[[], Awaitable[bool]]) -> bool:
        """A state change; one the store refuses (the job is no longer this worker's) writes
        nothing. One the store cannot take is tried again while half the job's lease is
        left (its last renewal was just before): a final state lost to a store stalled past
        its timeout left the job to run again once the lease ran out (30 s later)."""
        try:
            return await persisting(change, self.config.lease_s / 2)
        except QueueError as exc:
            log.warning("jobs: a state change was lost", extra={"fields": {"error": str(exc)}})
            return False

    async def _renew(self) -> None:
        """Every `renew_s` while a job is held (an idle proxy woke twice a second for none)."""
        while await self._holding.wait() and await self._pause(self.config.renew_s):
            if not self._held:
                continue
            held = {job_id: token for job_id, (token, _) in self._held.items()}
            try:
                lost = await self.queue.renew(held, self.config.lease_s)
            except QueueError:
                continue  # tried again next time; the lease outlives a few misses
            for job_id in lost:
                entry = self._held.get(job_id)
                if entry is not None and entry[0] == held[job_id]:
                    entry[1].cancel()

    async def _sweep(self) -> None:
        """Expired jobs removed now and then; the queue's depth on /metrics every 5 s."""
        swept = 0.0
        while not self._stopping:
            with contextlib.suppress(QueueError):
                if time.monotonic() - swept >= SWEEP_S:
                    swept = time.monotonic()
                    removed = await sweep(self.queue, await self.queue.now())
                    if removed:
                        log.info("jobs: expired removed", extra={"fields": {"removed": removed}})
                depth = await self.queue.depth()
                metrics.JOBS_WAITING.labels("queued").set(depth.queued)
                metrics.JOBS_WAITING.labels("running").set(depth.running)
                metrics.JOBS_OLDEST_S.set(depth.oldest_queued_s)
            await self._pause(5.0)


async def sweep(queue: JobQueue, now: float, step: int = SWEEP_STEP) -> int:
    """Every job past its time to keep at `now` removed, `step` at a time; how many."""
    removed = 0
    while True:
        gone = await queue.sweep(now, step)
        removed += gone
        if gone < step:
            return removed


_STOPPED = {"status": 503, "error": "the worker running the job stopped; it runs again"}
