"""Calls to an endpoint that has stopped answering fail at once, until it answers again.

An endpoint whose calls get no answer (a process frozen, a node gone, an address that
accepts connections and is no gRPC server) costs each request its whole budget: a partial
pipeline answers from its other branches only at its deadline, an all-or-nothing one holds
every client until its 504. Measured before this, with one branch's endpoint a port that
accepts and never answers: `digits-partial` took 3 s a request (its budget) instead of 5 ms.
An endpoint that refuses is failed at once by gRPC itself, then retried (NEITHER).

After THRESHOLD calls in a row ended without an answer (out of time after STALL_S or
more), each sent after the endpoint last answered, or as soon as a
call has been out a stall (stalls.py, at least STALL_S) with no answer since it left, the
endpoint is asked whether it is ready (ServerReady/ModelReady, CHECK_TIMEOUT_S). An
endpoint that answers is alive, its calls merely slow for their budgets (an OCR page under
a 300 ms budget), and nothing changes. One that does not is *not answering*: its calls fail
UNAVAILABLE at once (503 with Retry-After; a partial pipeline's branch), and the check is
repeated every CHECK_EVERY_S; the first answer opens it to calls again. No request waits on
a check, and the calls out when it is found not answering fail then, not at their deadline.

Per address, whatever models it serves: a frozen process stalls all of them. An address
naming several replicas (balancing.py) is checked through the balancer, so it is not
answering only when none of its replicas is; one stalled replica of several is passed over
by hedging.py without this.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import grpc

from proxy import metrics
from proxy.transport.stalls import STALL_FACTOR

log = logging.getLogger(__name__)

THRESHOLD = 3
"""Calls in a row without an answer before the endpoint is checked."""

STALL_S = 0.25
"""A call out of time counts only after this long: a client's budget of a few milliseconds
says nothing about the endpoint."""

CHECK_TIMEOUT_S = 1.0
CHECK_EVERY_S = 0.25

NEITHER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
"""Ends that are neither an answer nor a miss: a connection refused or closed is already
failed at once by gRPC, and a retry after a short back-off is what lets a restarting
service's calls through (counted as misses, a refusal for a few milliseconds under load
turned the next 0.25 s of calls into 503s)."""

Check = Callable[[str, str, float], Awaitable[tuple[bool, str]]]
"""(address, model, timeout) -> (ready, why not): Services.ready."""


class Breaker:
    """One endpoint's record of answers, and whether calls to it go out."""

    __slots__ = (
        "_check",
        "_next",
        "_released",
        "_task",
        "_timer",
        "address",
        "answered_at",
        "last_miss",
        "misses",
        "refusing",
        "started",
        "typical_s",
        "waiting",
    )

    def __init__(self, address: str, check: Check) -> None:
        self.address = address
        self._check = check
        self.answered_at = 0.0
        """When the endpoint last answered (time.monotonic)."""
        self.misses = 0
        """Calls in a row, sent since then, that got no answer."""
        self.last_miss = ""
        self.refusing = False
        """True while the endpoint is not answering: calls fail at once."""
        self.started: dict[int, float] = {}
        """Calls out: token -> when it left (oldest first)."""
        self.waiting: dict[int, asyncio.Task] = {}
        """The tasks waiting on calls out, to release when the endpoint is not answering."""
        self._released: set[int] = set()
        self.typical_s = 0.0
        """What an answered call took, recently (an exponentially weighted mean)."""
        self._next = 0
        self._task: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None
        metrics.NOT_ANSWERING.labels(address).set(0)  # a series from the first call on

    def sending(self, model: str, task: asyncio.Task | None = None) -> int:
        """A call leaves: its token, for `answered`, `missed` or `forget`. `task`, waiting
        on the call, is cancelled if the endpoint is found not answering meanwhile (the
        caller then asks `let_go`)."""
        # Inline, no helper calls: it runs on every call (stalls.py has the same rule).
        token = self._next = self._next + 1
        now = time.monotonic()
        self.started[token] = now
        if task is not None:
            self.waiting[token] = task
        if self._timer is None:
            self._look_later(model, now)
        return token

    def _look_later(self, model: str, now: float) -> None:
        """Look at the calls out when the first one sent since the last answer would have
        stalled: a frozen process's calls may end only at their deadline, and a closed loop
        of clients sends no other call meanwhile."""
        if not self.started:
            return
        stall_s = self._stall_s()
        first = self._first_unanswered()
        delay = stall_s if first is None else first + stall_s - now
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(delay if delay > 0 else stall_s, self._look, model)

    def _look(self, model: str) -> None:
        self._timer = None
        now = time.monotonic()
        first = self._first_unanswered()
        if first is not None and now - first >= self._stall_s():
            self._suspect(model)
        self._look_later(model, now)

    def _first_unanswered(self) -> float | None:
        """When the first call still out that left after the last answer left (calls sent
        earlier may be out on a connection that answered since: they say nothing)."""
        answered_at = self.answered_at
        return next((t for t in self.started.values() if t > answered_at), None)

    def _stall_s(self) -> float:
        return max(STALL_S, STALL_FACTOR * self.typical_s)

    def answered(self, token: int | None = None) -> None:
        now = self.answered_at = time.monotonic()
        self.misses = 0
        if token is None:
            return
        self.waiting.pop(token, None)
        if (began := self.started.pop(token, None)) is not None:
            typical = self.typical_s
            self.typical_s = (
                now - began if typical == 0.0 else typical + 0.1 * (now - began - typical)
            )

    def forget(self, token: int) -> None:
        """The call of `token` ended its caller's way (cancelled): it says nothing."""
        self.started.pop(token, None)
        self.waiting.pop(token, None)

    def let_go(self, token: int) -> bool:
        """Whether the call of `token` was cancelled because the endpoint is not answering
        (its caller then fails it as refused, its own cancellation taken back)."""
        if token in self._released:
            self._released.discard(token)
            return True
        return False

    def _release(self) -> None:
        """Calls out now fail at once, not at their deadline: a frozen process's calls
        would otherwise hold their requests for their whole budget (15 s for an OCR page)."""
        for token, task in list(self.waiting.items()):
            self._released.add(token)
            task.cancel()
        self.waiting.clear()

    def missed(self, token: int, code: grpc.StatusCode, details: str, model: str) -> None:
        """The call of `token` ended with `code`."""
        sent_at = self.started.pop(token, 0.0)
        self.waiting.pop(token, None)
        out_s = time.monotonic() - sent_at
        if code in NEITHER:
            return
        if code != grpc.StatusCode.DEADLINE_EXCEEDED:
            self.answered()  # an error is an answer: the endpoint is there
            return
        if sent_at < self.answered_at or out_s < STALL_S:
            return
        self.misses += 1
        self.last_miss = f"{code.name}: {details}"
        if self.misses >= THRESHOLD:
            self._suspect(model)

    def _suspect(self, model: str) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._watch(model))
            self._task.add_done_callback(self._watched)

    def refuse(self) -> str:
        """Why a call is not sent (while `refusing`), the refusal counted."""
        metrics.CALLS_REFUSED.labels(self.address).inc()
        return self.refusal()

    def refusal(self) -> str:
        """Why a call is not sent (while `refusing`)."""
        return (
            f"endpoint {self.address} is not answering: its calls got no answer (the last "
            f"{self.last_miss or 'still out'}), nor did a readiness check; calls fail at "
            f"once until it answers one (asked every {CHECK_EVERY_S:g} s)"
        )

    async def _watch(self, model: str) -> None:
        """Check once; while unanswered, keep calls from going and check again."""
        while True:
            ready, why = await self._check(self.address, model, CHECK_TIMEOUT_S)
            if ready:
                if self.refusing:
                    log.warning("endpoint %s answers again: calls go out", self.address)
                self.refusing = False
                self.answered()
                metrics.NOT_ANSWERING.labels(self.address).set(0)
                return
            if not self.refusing:
                self.refusing = True
                self._release()
                metrics.NOT_ANSWERING.labels(self.address).set(1)
                log.warning(
                    "endpoint %s is not answering (calls without an answer: %d ended, %d "
                    "out; the last %s; readiness: %s): its calls fail at once until it answers",
                    self.address,
                    self.misses,
                    len(self.started),
                    self.last_miss or "-",
                    why,
                )
            await asyncio.sleep(CHECK_EVERY_S)

    def _watched(self, task: asyncio.Task) -> None:
        self._task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("checking endpoint %s failed", self.address, exc_info=task.exception())
            self.refusing = False  # never left refusing calls by a check that broke


class Breakers:
    """The breakers of this process, one per address, made on first use."""

    def __init__(self, check: Check) -> None:
        self._check = check
        self._by_address: dict[str, Breaker] = {}

    def get(self, address: str) -> Breaker:
        breaker = self._by_address.get(address)
        if breaker is None:
            breaker = self._by_address[address] = Breaker(address, self._check)
        return breaker
