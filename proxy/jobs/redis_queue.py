"""The jobs' queue in Redis: shared by proxy replicas and worker processes. A stream with a
consumer group carries the attempts (redelivered by XAUTOCLAIM when a worker's lease, the
entry's idle time, runs out); each state change is one Lua script (redis_scripts.py); a
worker's next job is found by redis_claims.py.

Run Redis with persistence (AOF, `appendonly yes`) and an eviction policy that spares keys
without a TTL (`volatile-lru`, or `noeviction`): unfinished jobs have none."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import orjson
from redis.exceptions import RedisError, ResponseError

from proxy.engine import redis_client
from proxy.jobs import redis_checks
from proxy.jobs import redis_scripts as lua
from proxy.jobs.grouping import Grouped, cut
from proxy.jobs.model import (
    CALLBACK_HOLD_S,
    Claimed,
    IdempotencyConflict,
    Job,
    QueueError,
    QueueFull,
    Submission,
    dumps,
    loads,
    new_id,
)
from proxy.jobs.queue import Depth, JobQueue, Page
from proxy.jobs.redis_claims import GROUP, Claims
from proxy.jobs.redis_clock import RedisClock
from proxy.jobs.redis_pages import ENDED, Pages

T = TypeVar("T")
log = logging.getLogger("proxy")
PREFIX = "{mesh-jobs}"
"""One hash slot (the braces) for every key: the scripts touch several."""
SHOWN = ("pipeline", "status", "created", "updated", "attempts", "max_attempts", "budget_ms")
SHOWN += ("result", "error", "callback", "callback_status", "finished", "expires")


def _job(job_id: str, f: list[bytes | None], clock: Callable[[], float]) -> Job | None:
    if f[0] is None:
        return None
    text = [None if v is None else v.decode() for v in f]
    if text[12] is not None and float(text[12]) <= clock():
        return None  # ended, kept its while: as good as swept

    def num(i: int) -> float:
        return float(text[i] or 0)

    return Job(
        job_id, text[0], text[1], num(2), num(3), int(num(4)), int(num(5)), num(6),  # type: ignore[arg-type]
        loads(f[7]), loads(f[8]), text[9] or None, text[10] or None,
        None if text[11] is None else float(text[11]),
    )  # fmt: skip


class RedisQueue(JobQueue):
    def __init__(
        self,
        url: str,
        keep_s: float,
        prefix: str = PREFIX,
        timeout_s: float = 10.0,
        callback_hold_s: float = CALLBACK_HOLD_S,
    ) -> None:
        self.url = redis_client.shown(url)
        """The store's address without credentials, as errors name it."""
        self.keep_s = keep_s
        self.callback_hold_s = callback_hold_s
        self._redis = redis_client.connect(
            url, timeout_s, retries=3, backoff=True, connect_timeout_s=min(5.0, timeout_s)
        )
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{new_id()[:8]}"
        self._k = {n: f"{prefix}:{n}" for n in ("stream", "queued", "running", "index")}
        self._k |= {n: f"{prefix}:{n}" for n in ("expiry", "delayed", "leases", "bytes")}
        self._k["callbacks"] = f"{prefix}:callbacks"
        self._job = f"{prefix}:job:"
        self._idem = f"{prefix}:idem:"
        names = ("SUBMIT", "TAKE", "FINISH", "REQUEUE", "DUE", "RENEW", "FORGET")
        names += ("CALLBACK_DONE", "CALLBACKS_DUE")
        self._scripts = {name: self._redis.register_script(getattr(lua, name)) for name in names}
        self._group_made = False
        self._clock = RedisClock(lambda: self._call(self._redis.time()))
        self._warned: set[str] = set()
        self._submit: Grouped[tuple[Submission, int, int], Any] = Grouped(self._submit_many)
        self._decode = decode = partial(_job, clock=self._clock.clock)
        self._pages = Pages(self._redis, prefix, SHOWN, decode, self._call)
        keys = self._k | {"job": self._job, "failed": self._pages.ended("failed")}
        self._claims = Claims(
            self._redis, keys, self._scripts, consumer=self.consumer, keep_s=keep_s,
            call=self._call, shown=SHOWN, decode=decode, now=self.now,
        )  # fmt: skip

    async def _call(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except (RedisError, OSError) as exc:
            self._group_made = False  # a restarted Redis without AOF lost the group
            # A read whose reply was lost (a timeout while Redis stalled) was still served
            # once Redis went on: its entry waits, delivered to this consumer, for nobody.
            self._claims.reread = True
            raise QueueError(f"redis {self.url}: {redis_client.described(exc)}") from None

    async def now(self) -> float:
        return await self._clock.now()

    async def _group(self) -> None:
        if self._group_made:
            return
        try:
            await self._redis.xgroup_create(self._k["stream"], GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        else:
            await self._pages.new_queue()
        self._group_made = True
        for warning in await redis_checks.warnings(self._redis, self.url):
            if warning not in self._warned:  # once a process, however often it reconnects
                self._warned.add(warning)
                log.warning(warning)

    def _submission(
        self, job: Submission, max_queued: int, max_bytes: int
    ) -> tuple[list[str], list[Any]]:
        """A job's own keys and arguments of SUBMIT."""
        listed = [
            "pipeline", job.pipeline, "status", "queued", "created", repr(job.created),
            "updated", repr(job.created), "attempts", "0", "max_attempts", str(job.max_attempts),
            "budget_ms", repr(job.budget_ms), "kind", job.kind, "callback", job.callback or "",
            "digest", job.digest,
        ]  # fmt: skip
        if job.traceparent:  # traces on: only then a field
            listed += ["traceparent", job.traceparent]
        idem = "" if job.idempotency_key is None else self._idem + job.idempotency_key
        # The key goes with its job (FORGET); until then a key whose job is gone names nothing.
        args: list[Any] = [job.id, max_queued, max_bytes, orjson.dumps(listed), job.payload]
        return [self._job + job.id, idem], args

    async def _submit_many(self, group: list[tuple[Submission, int, int]]) -> list[Any]:
        """The group in SUBMIT calls of at most CALL_BYTES of uploads each (one round trip
        and one script a call: most groups one call); each job's reply, or why it failed."""
        await self._call(self._group())
        replies: list[Any] = []
        for part in cut(group, lambda submitted: len(submitted[0].payload), CALL_BYTES):
            try:
                replies += await self._call(self._submit_part(part))
            except QueueError as exc:
                if not replies:
                    raise  # nothing stored: the same error for every job
                return replies + [exc] * (len(group) - len(replies))
        return replies

    async def _submit_part(self, part: list[tuple[Submission, int, int]]) -> list[Any]:
        k = self._k
        keys: list[Any] = [k["queued"], k["running"], k["index"], k["stream"], k["bytes"]]
        args: list[Any] = []
        for submitted in part:
            own_keys, own_args = self._submission(*submitted)
            keys += own_keys
            args += own_args
        try:
            return await self._scripts["SUBMIT"](keys, args)
        except ResponseError as exc:  # the script's own (e.g. out of memory): each job's
            return [exc] * len(part)

    async def submit(
        self, job: Submission, max_queued: int, max_bytes: int = 0
    ) -> tuple[Job, bool]:
        # _call: the group hands back its own script's error too (e.g. Redis out of memory).
        reply = await self._call(self._submit((job, max_queued, max_bytes)))
        if isinstance(reply, QueueError):  # its part of the group was not stored
            raise QueueError(str(reply))
        if isinstance(reply, Exception):
            raise QueueError(f"redis {self.url}: {reply!r}")
        outcome, detail = reply[0].decode(), reply[1].decode()
        if outcome == "full":
            raise QueueFull(detail)
        if outcome == "conflict":
            raise IdempotencyConflict(detail)
        if outcome == "new":
            return Job(
                job.id, job.pipeline, "queued", job.created, job.created, 0, job.max_attempts,
                job.budget_ms, callback=job.callback,
            ), True  # fmt: skip
        found = await self.get(detail)
        if found is None:  # ended and expired between the two calls
            raise QueueError(f"job {detail} of this Idempotency-Key is gone")
        return found, outcome == "new"

    async def get(self, job_id: str) -> Job | None:
        return self._decode(job_id, await self._call(self._redis.hmget(self._job + job_id, SHOWN)))

    async def page(
        self, pipeline: str | None, status: str | None, limit: int, cursor: str | None
    ) -> Page:
        return await self._pages.page(pipeline, status, limit, cursor)

    async def cancel(self, job_id: str, keep_s: float) -> tuple[Job | None, bool]:
        ended = await self._end(job_id, "", "cancelled", keep_s)
        return await self.get(job_id), ended

    async def _end(self, job_id: str, token: str, status: str, keep_s: float, *fields: Any) -> bool:
        k = self._k
        keys = [self._job + job_id, k["running"], k["stream"], k["expiry"], k["queued"]]
        keys += [k["delayed"], k["leases"], self._pages.ended(status), k["bytes"], k["callbacks"]]
        now = await self.now()
        args = [job_id, token, status, repr(now), int(keep_s * 1000), GROUP]
        args += [repr(now + self.callback_hold_s), *fields]
        return bool(await self._call(self._scripts["FINISH"](keys, args)))

    async def claim(self, lease_s: float, wait_s: float) -> Claimed | None:
        await self._call(self._group())
        return await self._claims.claim(lease_s, wait_s)

    async def renew(self, held: dict[str, str], lease_s: float) -> set[str]:
        lost = set()
        until = repr(await self.now() + lease_s)
        for job_id, token in held.items():
            keys = [self._job + job_id, self._k["stream"], self._k["leases"]]
            args = [job_id, token, GROUP, self.consumer, until]
            if not await self._call(self._scripts["RENEW"](keys, args)):
                lost.add(job_id)
        return lost

    async def finish(
        self, claimed: Claimed, status: str, result: Any, error: Any, keep_s: float
    ) -> bool:
        fields: list[Any] = []
        if result is not None:
            fields += ["result", dumps(result)]
        if error is not None:
            fields += ["error", dumps(error)]
        return await self._end(claimed.job.id, claimed.token, status, keep_s, *fields)

    async def requeue(self, claimed: Claimed, error: Any, delay_s: float) -> bool:
        k, now = self._k, await self.now()
        keys = [self._job + claimed.job.id, k["running"], k["queued"], k["stream"], k["delayed"]]
        keys.append(k["leases"])
        args = [claimed.job.id, claimed.token, repr(now), repr(now + delay_s), dumps(error), GROUP]
        return bool(await self._call(self._scripts["REQUEUE"](keys, args)))

    async def callback_done(self, job_id: str, outcome: str, retry_at: float | None) -> None:
        keys = [self._job + job_id, self._k["callbacks"]]
        args = [job_id, outcome, "" if retry_at is None else repr(retry_at)]
        await self._call(self._scripts["CALLBACK_DONE"](keys, args))

    async def due_callbacks(self, now: float, most: int) -> list[str]:
        args = [repr(now), repr(now + self.callback_hold_s), most]
        due = await self._call(self._scripts["CALLBACKS_DUE"]([self._k["callbacks"]], args))
        return [job_id.decode() for job_id in due]

    async def sweep(self, now: float, most: int) -> int:
        expiry = self._k["expiry"]
        gone = await self._call(self._redis.zrangebyscore(expiry, "-inf", now, 0, most))
        if gone:
            forget = self._scripts["FORGET"]
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in (self._k["index"], self._k["expiry"], *map(self._pages.ended, ENDED)):
                    pipe.zrem(key, *gone)
                for job_id in gone:
                    keys = [self._job + job_id.decode(), self._k["callbacks"]]
                    await forget(keys, [job_id], client=pipe)
                await self._call(pipe.execute())
        return len(gone)

    async def depth(self) -> Depth:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcard(self._k["queued"]).scard(self._k["running"])
            pipe.zrange(self._k["queued"], 0, 0, withscores=True)
            queued, running, oldest = await self._call(pipe.execute())
        age = await self.now() - oldest[0][1] if oldest else 0.0
        return Depth(queued, running, max(0.0, age))

    async def ping(self) -> None:
        await self._call(self._redis.ping())

    async def close(self) -> None:
        # What is under way first: a call after the close would open a connection nobody
        # closes (each call is bounded by the client's timeout).
        await asyncio.gather(self._submit.settle(), self._clock.settle())
        await self._redis.aclose(close_connection_pool=True)


CALL_BYTES = 8 * 2**20
"""Uploads sent in one SUBMIT call at most (a group's others go in the next): Redis reads a
call whole before it runs it, and runs its script alone, every other client waiting."""
