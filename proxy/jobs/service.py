"""Jobs as the doors and the worker process see them: submitted, read, listed, cancelled;
run by this process's workers when it has any; their callbacks sent (outbox.py)."""

from __future__ import annotations

import asyncio
import logging

from proxy import metrics
from proxy.engine import redis_client
from proxy.engine.runner import Engine
from proxy.jobs import callbacks
from proxy.jobs.model import Claimed, Job, JobsConfig, QueueError, Submission
from proxy.jobs.outbox import Outbox
from proxy.jobs.queue import JobQueue, Page, open_queue
from proxy.jobs.running import Outcome, attempt
from proxy.jobs.workers import Workers

log = logging.getLogger("proxy")


class Jobs:
    def __init__(self, engine: Engine, config: JobsConfig) -> None:
        self.engine = engine
        self.config = config
        self.queue: JobQueue = open_queue(
            config.url, config.keep_s, config.callback_hold_s, config.min_free_bytes
        )
        self.workers = (
            Workers(self.queue, self._attempt, config, self._ended) if config.workers else None
        )
        self.outbox = Outbox(self.queue, config)
        self._looking: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.outbox.start()
        if self.workers is not None:
            self.workers.start()
            self._looking = asyncio.create_task(self.outbox.look())

    async def stop(self) -> None:
        if self.workers is not None:
            await self.workers.stop()
        if self._looking is not None:
            self._looking.cancel()
            await asyncio.gather(self._looking, return_exceptions=True)
        await self.outbox.stop()
        await self.queue.close()

    @property
    def address(self) -> str:
        """The queue's URL without credentials (what /readyz shows)."""
        return redis_client.shown(self.config.url)

    async def check(self, timeout_s: float) -> tuple[bool, str]:
        """The queue's store answers (for /readyz)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.queue.ping()
        except TimeoutError:
            return False, f"the jobs' store did not answer within {timeout_s:g} s"
        except QueueError as exc:
            return False, str(exc)
        return True, ""

    def callback(self, url: str) -> str:
        """`url` if allowed (callbacks.check); 400 otherwise."""
        return callbacks.check(url, self.config.callback_hosts)

    async def submit(self, submission: Submission) -> tuple[Job, bool]:
        config = self.config
        submission.created = await self.queue.now()
        job, new = await self.queue.submit(submission, config.max_queued, config.max_queued_bytes)
        if new:
            self.queue.notify()
            metrics.JOBS_SUBMITTED.labels(job.pipeline).inc()
        return job, new

    async def get(self, job_id: str) -> Job | None:
        return await self.queue.get(job_id)

    async def page(
        self, pipeline: str | None, status: str | None, limit: int, cursor: str | None
    ) -> Page:
        return await self.queue.page(pipeline, status, limit, cursor)

    async def cancel(self, job_id: str) -> tuple[Job | None, bool]:
        """The job after the cancel, and whether this cancel ended it."""
        job, ended = await self.queue.cancel(job_id, self.config.keep_s)
        if ended and job is not None:
            metrics.JOBS_FINISHED.labels(job.pipeline, "cancelled").inc()
            await self._ended(job)
        return job, ended

    async def _attempt(self, claimed: Claimed) -> Outcome:
        return await attempt(self.engine, claimed, self.config.share)

    async def _ended(self, ended: Job) -> None:
        """A job's final state was written here: its callback, if it has one, tried at once
        (from a task of its own: neither the store nor the receiver holds the worker)."""
        if ended.callback:
            self.outbox.send(ended.id)
