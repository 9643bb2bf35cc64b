"""Callbacks that outlive their process and a receiver's outage: the queue's outbox.

An ended job with a callback is in the outbox from the write of its final state until its
callback is delivered or refused (or the job is removed after its time to keep):
- the process that wrote the final state tries it at once (the entry is held for it
  `callback_hold_s`: nobody else tries it meanwhile);
- a try that fails puts it back, due after as long again as the job has been ended
  (`callback_first_s` at least, `callback_most_s` at most): tries about 0, 0.5, 1, 2, 4 ...
  seconds after the end, then every 10 minutes;
- every process running workers looks at the outbox each second and tries what is due
  there, held for it the same way.
So a callback still goes when the process that ended its job died or was replaced before
sending it (a crash, a rolling update; a job failed because its worker died on its last
attempt had nobody to send it), or when the receiver was down for a while. Each callback was
tried six times over ~15 s by that process alone before, and lost with it.

At least once: a process that dies between a POST and writing how it went leaves the
callback to be sent again, as does a try that outlasts its hold while another process takes
it; the body's `id` tells a receiver it has seen it. A callback whose delivery (or final
refusal) is written is never sent again: each try reads it first."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from functools import partial

import httpx

from proxy import metrics
from proxy.errors import Problem
from proxy.jobs import callbacks
from proxy.jobs.model import Job, JobsConfig, QueueError
from proxy.jobs.queue import JobQueue, persisting

log = logging.getLogger("proxy")

LOOK_S = 1.0
"""How often a process running workers looks for callbacks due."""
TAKEN_AT_ONCE = 16
IN_FLIGHT = 100
"""Callbacks this process tries at once, at most (httpx's pool holds 100 connections; a
receiver that hangs holds each try callbacks.TRY_S, 10 s): more wait their turn here."""
WAITING = 10_000
"""Callbacks waiting their turn here, at most; beyond, they wait out their hold in the outbox
and a later look takes them (a task each for every job ended while a receiver hung, before)."""
SAY_EVERY_S = 30.0
STORE_FOR_S = 16.0
"""How long a read or write of the store is tried again (a stall, a failover): within the
hold, so that a callback delivered is not sent again for a write that came late."""


class Outbox:
    def __init__(self, queue: JobQueue, config: JobsConfig) -> None:
        self.queue = queue
        self.config = config
        self._client: httpx.AsyncClient | None = None
        self._trying: dict[str, asyncio.Task[None]] = {}
        self._waiting: collections.deque[str] = collections.deque()
        self._stopping = False
        self._said = -SAY_EVERY_S
        self._unsaid = 0
        """Failed tries since the last said."""

    def start(self) -> None:
        # Each try is bounded as a whole by callbacks.TRY_S; each read by as long.
        self._client = httpx.AsyncClient(timeout=callbacks.TRY_S, follow_redirects=False)

    async def stop(self) -> None:
        """Tries under way get a moment; the others stay in the outbox, held a while, then
        tried by the next process to look."""
        self._stopping = True
        self._waiting.clear()
        tries = list(self._trying.values())
        if tries:
            await asyncio.wait(tries, timeout=2.0)
        for task in tries:
            task.cancel()
        await asyncio.gather(*tries, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    def send(self, job_id: str) -> None:
        """Try the job's callback now: its final state was just written here, or it is due
        and held for this process."""
        if self._client is None or self._stopping or job_id in self._trying:
            return
        if len(self._trying) < IN_FLIGHT:
            self._start(job_id)
        elif len(self._waiting) < WAITING:
            self._waiting.append(job_id)

    def _start(self, job_id: str) -> None:
        task = asyncio.create_task(self._try(job_id))
        self._trying[job_id] = task
        task.add_done_callback(lambda _: self._next(job_id))

    def _next(self, ended: str) -> None:
        """A try ended: the next one waiting its turn starts."""
        self._trying.pop(ended, None)
        while self._waiting and len(self._trying) < IN_FLIGHT and not self._stopping:
            job_id = self._waiting.popleft()
            if job_id not in self._trying:  # taken again by a look meanwhile
                self._start(job_id)
                return

    async def look(self) -> None:
        """Forever: the callbacks due (whichever process ended their jobs), tried here."""
        while True:
            await asyncio.sleep(LOOK_S)
            room = min(TAKEN_AT_ONCE, IN_FLIGHT - len(self._trying))
            if room <= 0:
                continue
            try:
                due = await self.queue.due_callbacks(await self.queue.now(), room)
            except QueueError:
                continue  # the workers say when the queue cannot be reached
            except Exception:  # a loop that died would leave every later callback unsent
                log.exception("jobs: the callbacks' outbox could not be read")
                continue
            for job_id in due:
                self.send(job_id)

    async def _try(self, job_id: str) -> None:
        assert self._client is not None
        try:
            job = await persisting(partial(self.queue.get, job_id), STORE_FOR_S)
        except QueueError as exc:  # still held: tried again once the hold is over
            log.warning("job callback waits", extra={"fields": {"job": job_id, "error": str(exc)}})
            return
        if job is None or not job.callback:  # removed meanwhile
            await self._record(job_id, "", None)
            return
        if _settled(job.callback_status):
            # Taken again by a look that read it due (its hold ran out while a slow try was
            # under way) and handed it over once that try had ended: already sent.
            return
        try:  # the hosts allowed now: an operator who takes one off means its callbacks too
            callbacks.check(job.callback, self.config.callback_hosts)
        except Problem as exc:
            outcome, final = f"refused: {exc.message}", True
        else:
            secret = self.config.callback_secret
            outcome, final = await callbacks.post(self._client, job.callback, job.public(), secret)
        retry_at = None
        if final:
            metrics.JOB_CALLBACKS.labels("delivered" if outcome == "delivered" else "refused").inc()
        else:
            metrics.JOB_CALLBACKS.labels("failed").inc()
            retry_at = self._next_try(job, await self.queue.now())
            outcome = f"retrying: {outcome}"
        if outcome != "delivered":
            self._say(job_id, job.callback, outcome)
        await self._record(job_id, outcome, retry_at)

    def _say(self, job_id: str, url: str, outcome: str) -> None:
        """A failed try, said at most once every SAY_EVERY_S with how many failed meanwhile:
        a receiver down while 500 jobs a second end would be 500 lines a second."""
        self._unsaid += 1
        now = time.monotonic()
        if now - self._said >= SAY_EVERY_S:
            fields = {"job": job_id, "url": url, "outcome": outcome, "failed": self._unsaid}
            log.warning("job callback failed", extra={"fields": fields})
            self._said, self._unsaid = now, 0

    def _next_try(self, job: Job, now: float) -> float:
        """As long again as the job has been ended, within the configured bounds."""
        ended_for = now - (job.finished or now)
        return now + min(max(ended_for, self.config.callback_first_s), self.config.callback_most_s)

    async def _record(self, job_id: str, outcome: str, retry_at: float | None) -> None:
        try:
            done = partial(self.queue.callback_done, job_id, outcome, retry_at)
            await persisting(done, STORE_FOR_S)
        except QueueError as exc:  # the hold runs out: tried again, maybe sent again
            log.warning(
                "job callback's outcome not written",
                extra={"fields": {"job": job_id, "outcome": outcome, "error": str(exc)}},
            )


def _settled(status: str | None) -> bool:
    """A callback delivered, or refused for good: never to be sent again."""
    return status is not None and (status == "delivered" or status.startswith("refused"))
