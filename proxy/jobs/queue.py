"""The jobs' queue: one interface, two backends (SQLite in a file, the embedded default;
Redis, shared by proxy replicas and worker processes), chosen by PROXY_JOBS_URL.

Every state change is one atomic step in the store, and a job's final state is written
once: a worker writes it only while it holds the job's lease and token, and a cancel writes
it only while the job is not final. A worker that dies leaves its job running with a lease
that runs out; then another worker takes it again (an attempt more).

An ended job with a callback stays in the queue's outbox until its callback is delivered or
refused (proxy/jobs/outbox.py): its final state's write puts it there, held for the writing
process, which tries it at once."""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from proxy.jobs.model import CALLBACK_HOLD_S, Claimed, Job, QueueError, Submission

T = TypeVar("T")


@dataclass(frozen=True)
class Page:
    jobs: list[Job]
    next: str | None
    """The cursor of the next page (None: this was the last)."""


@dataclass(frozen=True)
class Depth:
    queued: int
    running: int
    oldest_queued_s: float
    """Age of the oldest job waiting to run (0 when none waits)."""


class JobQueue(abc.ABC):
    url: str
    claim_wait_s = 1.0
    """How long an idle worker's claim waits before it returns empty-handed (and the worker
    sees whether it is stopping): short where a wait cannot be cut short by `notify`."""

    async def now(self) -> float:
        """Now, in epoch seconds, as the store's times are written and compared: every
        process sharing a store must agree on it (leases, back-offs, due callbacks, expiry)."""
        return time.time()

    @abc.abstractmethod
    async def submit(
        self, job: Submission, max_queued: int, max_bytes: int = 0
    ) -> tuple[Job, bool]:
        """Store `job`, or the job its Idempotency-Key already names (False: not new).
        QueueFull when `max_queued` jobs are unfinished, or when the unfinished jobs' uploads
        and this one's would pass `max_bytes` (0: no such bound); IdempotencyConflict when
        the key names a job of another body."""

    @abc.abstractmethod
    async def get(self, job_id: str) -> Job | None: ...

    @abc.abstractmethod
    async def page(
        self, pipeline: str | None, status: str | None, limit: int, cursor: str | None
    ) -> Page:
        """Jobs newest first, filtered; `cursor` from the previous page."""

    @abc.abstractmethod
    async def cancel(self, job_id: str, keep_s: float) -> tuple[Job | None, bool]:
        """Cancelled (kept `keep_s` seconds) if not final yet (a running job's worker
        learns it at its next renew): the job as it now is (None when unknown), and whether
        this cancel ended it."""

    @abc.abstractmethod
    async def claim(self, lease_s: float, wait_s: float) -> Claimed | None:
        """The oldest job due (queued, or running on a lease that ran out), now running
        for `lease_s` under a new token and one attempt more; None after `wait_s`."""

    @abc.abstractmethod
    async def renew(self, held: dict[str, str], lease_s: float) -> set[str]:
        """Extend the leases of `held` (id -> token); the ids this worker no longer holds
        (cancelled, or taken by another worker after its lease ran out)."""

    @abc.abstractmethod
    async def finish(
        self, claimed: Claimed, status: str, result: Any, error: Any, keep_s: float
    ) -> bool:
        """Write the final state (kept `keep_s` seconds), if the job is still this worker's;
        False when it is not (cancelled, or taken again)."""

    @abc.abstractmethod
    async def requeue(self, claimed: Claimed, error: Any, delay_s: float) -> bool:
        """Back to queued, due in `delay_s`, its last error kept; False when not held."""

    @abc.abstractmethod
    async def callback_done(self, job_id: str, outcome: str, retry_at: float | None) -> None:
        """Record how a try of the job's callback went (its `callback_status`); the callback
        stays in the outbox until `retry_at` (epoch seconds), or leaves it (None: delivered,
        refused). Nothing for a job gone."""

    @abc.abstractmethod
    async def due_callbacks(self, now: float, most: int) -> list[str]:
        """Up to `most` ended jobs whose callback is due at `now` (its writer's process
        died, or its last try failed and its wait is over), each held for the queue's
        `callback_hold_s` by the caller, who tries it now."""

    @abc.abstractmethod
    async def sweep(self, now: float, most: int) -> int:
        """Remove up to `most` jobs past their time to keep; how many."""

    @abc.abstractmethod
    async def depth(self) -> Depth: ...

    @abc.abstractmethod
    async def ping(self) -> None:
        """QueueError when the store cannot be reached."""

    def notify(self) -> None:  # noqa: B027 (a hint; most stores need none)
        """A job was submitted in this process: idle workers look now."""

    def stop_claims(self) -> None:  # noqa: B027 (where claims wait claim_wait_s at most)
        """The workers are stopping: claims waiting for a job return None now, later ones at
        once, until `allow_claims`."""

    def allow_claims(self) -> None:  # noqa: B027
        """Workers start (again): claims wait for jobs."""

    @abc.abstractmethod
    async def close(self) -> None: ...


async def persisting(call: Callable[[], Awaitable[T]], for_s: float) -> T:
    """`call()`, tried again while it raises QueueError (a store stalled past its timeout, a
    failover), after waits doubling from 0.25 s, while the next try would still come within
    `for_s`; then its last QueueError is raised."""
    until = time.monotonic() + for_s
    wait = 0.25
    while True:
        try:
            return await call()
        except QueueError:
            if time.monotonic() + wait >= until:
                raise
        await asyncio.sleep(wait)
        wait *= 2


def open_queue(
    url: str, keep_s: float, callback_hold_s: float = CALLBACK_HOLD_S, min_free_bytes: int = 0
) -> JobQueue:
    """The backend `url` names: `sqlite:///path/jobs.sqlite3` or `redis://host:port/db`;
    ended jobs are kept `keep_s` seconds; a callback being tried is left to its process
    `callback_hold_s` seconds before another may try it; SQLite takes no upload that would
    leave its disk less than `min_free_bytes` free (Redis has its own `maxmemory`)."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        from proxy.jobs.redis_queue import RedisQueue

        return RedisQueue(url, keep_s, callback_hold_s=callback_hold_s)
    if url.startswith("sqlite:///"):
        from proxy.jobs.sqlite_queue import SqliteQueue

        return SqliteQueue(url, keep_s, callback_hold_s, min_free_bytes)
    raise ValueError(
        f"PROXY_JOBS_URL {url!r}: use sqlite:///path/to/jobs.sqlite3 or redis://host:port/db"
    )
