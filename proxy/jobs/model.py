"""A job as every backend stores it and every door shows it.

A job is one pipeline request that answers later: its input (an image's bytes, or a tensor
pipeline's tensors packed as a cache entry is), its state, and once it ends, either the
answer `/infer` would have given (`result`) or the error it would have given (`error`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
STATUSES: tuple[Status, ...] = ("queued", "running", "succeeded", "failed", "cancelled")
FINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
InputKind = Literal["image", "tensors"]


@dataclass(frozen=True)
class JobsConfig:
    """The jobs' settings (PROXY_JOBS_*), as the service and its workers read them."""

    url: str
    workers: int
    """Jobs this process runs at once."""
    max_queued: int
    max_queued_bytes: int
    keep_s: float
    lease_s: float
    attempts: int
    share: float
    callback_hosts: frozenset[str]
    backoff_s: float = 1.0
    """First wait before another attempt; doubled each time, jittered, at most 60 s."""
    callback_first_s: float = 0.5
    """Shortest wait before a failed callback is tried again; each wait is as long as the
    job has been ended (tries at 0, 0.5, 1, 2, 4 ... s), up to `callback_most_s`."""
    callback_most_s: float = 600.0
    callback_hold_s: float = 30.0
    """How long a callback being tried is left to its process before another tries it."""
    callback_secret: bytes | None = None
    """Signs every callback (callbacks.signature)."""
    min_free_bytes: int = 64_000_000
    """SQLite: the disk room submissions leave for the jobs it holds to end (0: none kept)."""

    @property
    def renew_s(self) -> float:
        # Often enough to cancel a job's calls soon after DELETE, and to keep a lease.
        return min(self.lease_s / 3, 0.5)


CALLBACK_HOLD_S = JobsConfig.callback_hold_s


class QueueFull(Exception):
    """The queue holds its bound of unfinished jobs, or of their uploads' bytes (429); the
    message says which."""


class IdempotencyConflict(Exception):
    """An Idempotency-Key already names a job of another pipeline or body (422)."""


class QueueError(Exception):
    """The queue's store cannot be reached or answered wrongly (503)."""


class StoreFull(Exception):
    """The store's disk would keep less free than its reserve with this upload (SQLite;
    args: the upload bytes it can take, this one's): the queue (sqlite_queue.py) says so as
    a QueueError, 503 + Retry-After."""


_ID_BATCH = 256
_ids: list[int] = []
"""Random 80-bit numbers drawn ahead, of which each id takes 74 bits."""


def new_id() -> str:
    """A job's id: a UUIDv7 (RFC 9562) as 32 hex digits, the millisecond it was made, then 74
    random bits from the OS's CSPRNG: unguessable (an id is a handle to its result) and in
    the order jobs came. In order, SQLite's index of ids takes a job at its end: random ids
    (uuid4) cost its store 35 us a job against 21 over 200,000 jobs, more as it grew. The
    random bits are drawn 256 ids at a time: a getrandom call per id was ~6% of an
    enqueue's time on the event loop."""
    if not _ids:
        raw = os.urandom(10 * _ID_BATCH)
        _ids.extend(int.from_bytes(raw[i : i + 10]) for i in range(0, len(raw), 10))
    drawn = _ids.pop()
    # 48 bits of time, version 7, 12 random bits, variant 0b10, 62 random bits.
    value = int(time.time() * 1000) << 80 | 0x7 << 76 | (drawn >> 68) << 64 | 0b10 << 62
    return f"{value | drawn & (1 << 62) - 1:032x}"


# A forked child would hand out the random bits its parent has left.
os.register_at_fork(after_in_child=_ids.clear)


@dataclass
class Submission:
    """What a door hands the queue: a job not stored yet."""

    pipeline: str
    kind: InputKind
    payload: bytes
    """The image's bytes, or the tensors packed (proxy/engine/cache/entries.py)."""
    max_attempts: int
    budget_ms: float
    """Each attempt's budget (the request's X-Request-Timeout-Ms, or the pipeline's)."""
    callback: str | None = None
    idempotency_key: str | None = None
    digest: str = ""
    """Hash of pipeline, kind and payload: an Idempotency-Key reused with another body is
    refused."""
    traceparent: str | None = None
    """The submitting request's span (W3C), when traces are on: the job's runs join its
    trace."""
    id: str = field(default_factory=new_id)
    created: float = field(default_factory=time.time)


@dataclass
class Job:
    id: str
    pipeline: str
    status: Status
    created: float
    updated: float
    attempts: int = 0
    max_attempts: int = 1
    budget_ms: float = 0.0
    result: Any = None
    error: Any = None
    """The last error, as /infer gives it: {"status": HTTP status, "error": message, ...}."""
    callback: str | None = None
    callback_status: str | None = None
    """None (no callback, or not tried yet), "delivered", "refused: <why>" (a 4xx answer: not
    tried again) or "retrying: <the last failure>"."""
    finished: float | None = None

    def public(self) -> dict[str, Any]:
        """The job as GET /v1/jobs/{id} answers it."""
        shown: dict[str, Any] = {
            "id": self.id,
            "pipeline": self.pipeline,
            "status": self.status,
            "created": iso(self.created),
            "updated": iso(self.updated),
            "attempts": self.attempts,
        }
        if self.finished is not None:
            shown["finished"] = iso(self.finished)
        if self.result is not None:
            shown["result"] = self.result
        if self.error is not None:
            shown["error"] = self.error
        if self.callback:
            shown["callback"] = {"url": self.callback, "status": self.callback_status}
        return shown


@dataclass
class Claimed:
    """A job a worker took: its input, and the token only its own final write carries
    (a worker that lost its lease cannot write over the one that took the job after)."""

    job: Job
    kind: InputKind
    payload: bytes
    token: str
    traceparent: str | None = None


_second: tuple[int, str] = (-1, "")
"""The last whole second formatted (an enqueue answers its job's creation: most in the same
second as the one before)."""


def iso(at: float) -> str:
    """`at` (epoch seconds) as ISO 8601 UTC with milliseconds."""
    global _second
    whole = int(at // 1)
    if whole != _second[0]:
        _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return f"{_second[1]}.{int(at % 1 * 1000):03d}Z"


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def loads(raw: bytes | str | None) -> Any:
    return None if raw is None else orjson.loads(raw)
