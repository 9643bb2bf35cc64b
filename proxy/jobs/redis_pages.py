"""GET /v1/jobs on the Redis queue: a page of jobs, newest first, read from the set that holds
the status asked for, so that a page costs what it shows, not every job kept.

- no status: `P:index` (every kept job, by creation);
- `queued`: `P:queued` (by creation); `running`: `P:running` (a set, as small as the workers
  running: read whole and sorted here);
- an ended status: `P:ended:<status>` (by creation), kept by the FINISH and TAKE scripts and
  swept with `P:index`.
Before these sets, a page filtered by a status read every kept job until it found enough:
polling `?status=queued&limit=1` on an empty queue read them all (4,000 kept jobs made the
poll cost as much as the jobs it waited for).

A queue written before the ended sets existed has them filled once, on the first page asked
for (`P:ended:indexed` marks it done; a queue made with them is marked when it is made)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from proxy.jobs.model import Job
from proxy.jobs.queue import Page

ENDED = ("succeeded", "failed", "cancelled")
CHUNK = 200
"""Jobs read a round trip."""

Decode = Callable[[str, list[bytes | None]], Job | None]
Call = Callable[[Awaitable[Any]], Awaitable[Any]]


class Pages:
    def __init__(
        self, redis: aioredis.Redis, prefix: str, shown: tuple[str, ...], decode: Decode, call: Call
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._job = f"{prefix}:job:"
        self._shown = shown
        self._decode = decode
        self._call = call
        self._indexed = False
        self._marker = f"{prefix}:ended:indexed"

    def ended(self, status: str) -> str:
        """The key of the set of jobs ended with `status`."""
        return f"{self._prefix}:ended:{status}"

    async def page(
        self, pipeline: str | None, status: str | None, limit: int, cursor: str | None
    ) -> Page:
        top: float | str = "+inf"
        after_id = None
        if cursor is not None:
            created, _, after_id = cursor.partition(":")
            top = float(created)
        if status == "running":
            found = self._running(top, after_id)
        else:
            await self._index_ended()
            # With no pipeline to match, every job of the set is one to show: limit + 1 read.
            first = limit + 1 if pipeline is None else CHUNK
            found = self._from_sorted(self._source(status), top, after_id, first)
        jobs: list[Job] = []
        async for job in found:
            if (pipeline is None or job.pipeline == pipeline) and (
                status is None or job.status == status
            ):
                jobs.append(job)
                if len(jobs) > limit:
                    break
        more = len(jobs) > limit
        jobs = jobs[:limit]
        return Page(jobs, f"{jobs[-1].created!r}:{jobs[-1].id}" if more else None)

    def _source(self, status: str | None) -> str:
        if status is None:
            return f"{self._prefix}:index"
        if status == "queued":
            return f"{self._prefix}:queued"
        return self.ended(status)

    async def _from_sorted(
        self, key: str, top: float | str, after_id: str | None, first: int
    ) -> AsyncIterator[Job]:
        """The jobs of sorted set `key`, newest first, from the cursor on: `first` of them
        read in the first round trip, CHUNK in each after."""
        offset, size = 0, min(first, CHUNK)
        while True:
            ids = await self._call(
                self._redis.zrevrangebyscore(
                    key, top, "-inf", start=offset, num=size, withscores=True
                )
            )
            size = CHUNK
            if not ids:
                return
            offset += len(ids)
            wanted = [
                raw.decode()
                for raw, score in ids
                if not _on_an_earlier_page(score, raw.decode(), top, after_id)
            ]
            for job in await self._read(wanted):
                yield job

    async def _running(self, top: float | str, after_id: str | None) -> AsyncIterator[Job]:
        ids = [
            raw.decode()
            for raw in await self._call(self._redis.smembers(f"{self._prefix}:running"))
        ]
        jobs = sorted(await self._read(ids), key=lambda j: (j.created, j.id), reverse=True)
        for job in jobs:
            if not _on_an_earlier_page(job.created, job.id, top, after_id):
                yield job

    async def _read(self, ids: list[str]) -> list[Job]:
        """The jobs of `ids` still kept (one round trip)."""
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(self._job + job_id, self._shown)
            rows = await self._call(pipe.execute())
        jobs = (self._decode(job_id, row) for job_id, row in zip(ids, rows, strict=True))
        return [job for job in jobs if job is not None]

    async def new_queue(self) -> None:
        """This queue was made just now: its ended sets have nothing to fill."""
        await self._call(self._redis.set(self._marker, "1"))
        self._indexed = True

    async def _index_ended(self) -> None:
        """Fill the ended sets from the index, once per queue (see the module's docstring)."""
        if self._indexed:
            return
        if not await self._call(self._redis.set(self._marker, "1", nx=True)):
            self._indexed = True
            return
        offset = 0
        while True:
            ids = await self._call(
                self._redis.zrange(f"{self._prefix}:index", offset, offset + CHUNK - 1)
            )
            if not ids:
                break
            offset += len(ids)
            async with self._redis.pipeline(transaction=False) as pipe:
                for raw in ids:
                    pipe.hmget(self._job + raw.decode(), "status", "created")
                rows = await self._call(pipe.execute())
            async with self._redis.pipeline(transaction=False) as pipe:
                for raw, (status, created) in zip(ids, rows, strict=True):
                    if status is not None and status.decode() in ENDED and created is not None:
                        pipe.zadd(self.ended(status.decode()), {raw: float(created)})
                await self._call(pipe.execute())
        self._indexed = True


def _on_an_earlier_page(
    created: float, job_id: str, top: float | str, after_id: str | None
) -> bool:
    """Whether the job at (created, job_id) came before the cursor (top, after_id), newest
    first and ids descending within a time ("+inf": no cursor)."""
    if top == "+inf":
        return False
    return created > float(top) or (
        created == float(top) and after_id is not None and job_id >= after_id
    )
