"""A worker's next job from the Redis queue's stream, wherever its entry waits: a job whose
worker died (its lease ran out), an entry this consumer holds but never took (a reply lost
while Redis stalled, or one taken over from a dead worker), or a new entry.

A call that times out while Redis stalls is still served once Redis goes on, its reply sent
to nobody. Two replies matter here: a read's (the entry is then delivered to this consumer,
which never heard of it) and a take's (the job then runs under a token nobody holds). Both
used to wait for the sweep of dead workers' entries, or for the lease: a 12 s stall left
eight jobs queued for four minutes. So after a failed call this consumer reads its own
pending entries again first, and a take whose answer was lost is asked again with its token
(redis_scripts.TAKE answers that as the same take)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from proxy.jobs.model import Claimed, Job, QueueError, new_id

GROUP = "workers"
LOST = '{"status": 503, "error": "the worker running the job stopped on its last attempt"}'
STRANDED = 16
"""Entries taken over at once from workers gone (XAUTOCLAIM's count): one a lease left a dead
process's eight entries to be run over four minutes."""
PENDING_PAGE = 100
DUE_EVERY_S = 0.05
"""How often the process's claims look for jobs whose back-off or lease is over (DUE): a
round trip of every claim before, a third of them, when a job is cheap (2,000 `digits`
jobs drained 1.7x the time of as many `/infer` calls). A job whose back-off ends waits this
much more at most; one whose lease ran out, already seconds late, too."""

Decode = Callable[[str, list[bytes | None]], Job | None]
Call = Callable[[Awaitable[Any]], Awaitable[Any]]


def _entries(read: list) -> list[tuple[str, str, None]]:
    """(entry id, job id, no token) of a stream read's entries; one deleted meanwhile has no
    fields."""
    return [(entry.decode(), fields[b"id"].decode(), None) for entry, fields in read if fields]


class Claims:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: dict[str, str],
        scripts: dict[str, Any],
        *,
        consumer: str,
        keep_s: float,
        call: Call,
        shown: tuple[str, ...],
        decode: Decode,
        now: Callable[[], Awaitable[float]],
    ) -> None:
        """`keys`: the queue's keys by name, with `job` the prefix of a job's hash and
        `failed` the set of failed jobs; `call`: the queue's, which sets `reread` when a call
        fails; `shown`: the fields a take reads, `decode` makes them a Job."""
        self._redis, self._k, self._scripts = redis, keys, scripts
        self.consumer, self._keep_ms = consumer, int(keep_s * 1000)
        self._call, self._shown, self._decode, self._now = call, shown, decode, now
        self._swept_stranded = 0.0
        self._due_at = 0.0
        """When the next claim asks DUE (time.monotonic)."""
        self._owned: deque[tuple[str, str, str | None]] = deque()
        """Entries this consumer holds and has not taken: entry id, job id, and the token of
        a take whose answer was lost (None: none tried)."""
        self.reread = False
        """A call failed: this consumer's pending entries are read again before new ones."""

    async def claim(self, lease_s: float, wait_s: float) -> Claimed | None:
        until = time.monotonic() + wait_s
        while True:
            left = until - time.monotonic()
            # Blocks a quarter second at most: a job whose back-off ends is seen that soon.
            claimed = await self._claim_once(lease_s, max(0.001, min(left, 0.25)))
            if claimed is not None or left <= 0.25:
                return claimed

    async def _claim_once(self, lease_s: float, block_s: float) -> Claimed | None:
        k = self._k
        if time.monotonic() >= self._due_at:
            keys = [k["delayed"], k["stream"], k["job"], k["leases"]]
            expired = await self._call(self._scripts["DUE"](keys, [await self._now()]))
            if expired:  # a job whose worker died: its lease ran out (more may have)
                claimed = await self._take(expired[1].decode(), expired[0].decode(), lease_s)
                if claimed is not None:
                    return claimed
            else:
                self._due_at = time.monotonic() + DUE_EVERY_S
        if self.reread:
            self.reread = False
            self._owned.extend(await self._pending_here())
        if time.monotonic() - self._swept_stranded > lease_s:
            # Entries read by workers that died before they took the job: idle for long.
            self._swept_stranded = time.monotonic()
            _, stranded, *_ = await self._call(
                self._redis.xautoclaim(
                    k["stream"], GROUP, self.consumer, int(lease_s * 2000), "0-0", count=STRANDED
                )
            )
            self._owned.extend(_entries(stranded))
        while self._owned:
            entry, job_id, token = self._owned.popleft()
            claimed = await self._take(entry, job_id, lease_s, token)
            if claimed is not None:
                return claimed
        read = await self._call(
            self._redis.xreadgroup(
                GROUP, self.consumer, {k["stream"]: ">"}, count=1, block=int(block_s * 1000)
            )
        )
        for entry, job_id, _ in _entries(read[0][1] if read else []):
            claimed = await self._take(entry, job_id, lease_s)
            if claimed is not None:
                return claimed
        return None

    async def _pending_here(self) -> list[tuple[str, str, None]]:
        """Every entry delivered to this consumer and not yet acknowledged: its jobs running
        here (TAKE leaves those, their leases live) and any whose delivery it never heard."""
        found: list[tuple[str, str, None]] = []
        after = "0"
        while True:
            read = await self._call(
                self._redis.xreadgroup(
                    GROUP, self.consumer, {self._k["stream"]: after}, count=PENDING_PAGE
                )
            )
            entries = read[0][1] if read else []
            found += _entries(entries)
            if len(entries) < PENDING_PAGE:
                return found
            after = entries[-1][0]

    async def _take(
        self, entry: str, job_id: str, lease_s: float, token: str | None = None
    ) -> Claimed | None:
        k, token, now = self._k, token or new_id(), await self._now()
        keys = [k["job"] + job_id, k["queued"], k["running"], k["stream"], k["expiry"]]
        keys += [k["leases"], k["failed"], k["bytes"], k["callbacks"]]
        args = [job_id, entry, token, repr(now), GROUP, self._keep_ms, LOST]
        args += [int(lease_s * 1000), self.consumer, *self._shown, "kind", "payload"]
        args.append("traceparent")
        try:
            fields = await self._call(self._scripts["TAKE"](keys, args))
        except QueueError:
            # Taken or not, nobody else may run it until its lease runs out: asked again
            # with the same token, it is this worker's at once.
            self._owned.appendleft((entry, job_id, token))
            raise
        if not isinstance(fields, list):  # gone, held or exhausted
            return None
        job = self._decode(job_id, fields[: len(self._shown)])
        if job is None:
            return None
        kind = (fields[-3] or b"image").decode()
        traceparent = (fields[-1] or b"").decode() or None
        return Claimed(job, kind, fields[-2] or b"", token, traceparent)  # type: ignore[arg-type]
