"""One call over a name's replicas (balancing.py) that a stalled replica cannot hold:
when the first attempt has not answered by the time calls of this name count as stalled
(stalls.py), and another replica is up and flowing, the same request goes there too
and the first answer wins; the other attempt is cancelled. Inference is idempotent, so the
worst a hedge costs is the work of a second attempt, and only for calls already late.

Why: a replica that froze (SIGSTOP, a GC pause, a node that vanished and drops packets)
answers nothing, not an error. Keepalive closes its connection within ~2 s
(PROXY_KEEPALIVE_MS), and until then every call on it would wait, with merged calls
(merging.py) holding many requests each. A replica whose call was overtaken by a
hedge is passed over for a while (Replicas.failed); calls that end DEADLINE_EXCEEDED after
stalling count the same.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from typing import Any

import grpc

from proxy import metrics
from proxy.transport.balancing import Replica, Replicas
from proxy.transport.failures import RETRYABLE, CallFailed

Attempt = Callable[[Replica, float], Coroutine[Any, Any, dict]]
"""Send the request to this replica with this many seconds left."""

_tokens = itertools.count()


class _Attempt:
    """One attempt on one replica: its call (the replica's load) counted from the moment it
    is made (a burst of calls picked in one turn must see each other), settled however it
    ends."""

    def __init__(self, replicas: Replicas, replica: Replica) -> None:
        self.replicas, self.replica = replicas, replica
        self.token = next(_tokens)
        self.stall_after = replicas.pace.stall_after()
        replica.calls.begin(self.token)

    def settle(self, failure: BaseException | None, cancelled: bool = False) -> None:
        replica, replicas = self.replica, self.replicas
        age = replica.calls.end(self.token)
        if cancelled:
            return
        if failure is None:
            replicas.succeeded(replica)
            replicas.pace.observe(age)
        elif isinstance(failure, CallFailed):
            code = failure.code()
            late = age >= self.stall_after
            if code in RETRYABLE or (code == grpc.StatusCode.DEADLINE_EXCEEDED and late):
                replicas.failed(replica)  # the retry must not land there again

    def settle_task(self, task: asyncio.Future) -> None:
        # A done callback: it runs even for a task cancelled before it started.
        self.settle(None if task.cancelled() else task.exception(), task.cancelled())


async def call_replica(replicas: Replicas, replica: Replica, send: Attempt, timeout: float) -> dict:
    """One attempt on one replica, from the caller's task."""
    attempt = _Attempt(replicas, replica)
    try:
        answer = await send(replica, timeout)
    except asyncio.CancelledError:
        attempt.settle(None, cancelled=True)
        raise
    except BaseException as exc:
        attempt.settle(exc)
        raise
    attempt.settle(None)
    return answer


def _start(replicas: Replicas, replica: Replica, send: Attempt, timeout: float) -> asyncio.Future:
    attempt = _Attempt(replicas, replica)
    task = asyncio.create_task(send(replica, timeout))
    task.add_done_callback(attempt.settle_task)
    return task


async def hedged(replicas: Replicas, first: Replica, send: Attempt, timeout: float) -> dict:
    """The answer of `first`, or of another replica when `first` stalls (module docstring)."""
    if len(replicas.addresses) < 2:
        return await call_replica(replicas, first, send, timeout)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    attempts = [_start(replicas, first, send, timeout)]
    try:
        done, _ = await asyncio.wait(attempts, timeout=replicas.pace.stall_after())
        if done:
            return attempts[0].result()
        other = replicas.alternative(first)
        left = deadline - loop.time()
        if other is None or left <= 0.001:
            return await attempts[0]
        replicas.failed(first)  # late: the next calls go elsewhere while it recovers
        attempts.append(_start(replicas, other, send, left))
        metrics.HEDGED.labels(replicas.target).inc()
        answer, by = await _first_success(attempts)
        if by is not attempts[0]:
            metrics.HEDGES_WON.labels(replicas.target).inc()
        return answer
    finally:
        for attempt in attempts:
            if not attempt.done():
                attempt.cancel()
                attempt.add_done_callback(_seen)


async def _first_success(attempts: list[asyncio.Future[dict]]) -> tuple[dict, asyncio.Future]:
    """The first attempt to succeed, with its answer; when all fail, the last failure."""
    pending = set(attempts)
    failure: BaseException | None = None
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for attempt in done:
            if attempt.exception() is None:
                return attempt.result(), attempt
            failure = attempt.exception()
    assert failure is not None
    raise failure


def _seen(attempt: asyncio.Future) -> None:
    if not attempt.cancelled():
        attempt.exception()
