"""What the proxy lets in: requests in flight, the bytes they hold, and per pipeline the
requests and image pixels it works on at once.

Bytes count from the first byte of an upload to the last tensor a request keeps, so a
flood of large requests is shed at the door (503 + Retry-After) while the proxy still
has the memory to answer the requests it took. A pipeline's own limits keep what it
takes within its budget: 32 clients sending 3000x3000 pages used to be taken all at once
and 3 of 65 were answered in time; beyond a pipeline's limits the rest wait for room while
its pace says they would be answered in time, and are told to come back otherwise
(engine/room.py).

Background requests (jobs) wait for room instead, within a share of those limits; and while
clients that wait are being served, or were within `quiet_s`, at most `busy_background` of
them run at once. The services' cores are shared: on two cores a 1,000-page OCR backlog run
eight at a time cost digits 2.6x its p99 at c=8, one at a time 1.5x (bench/README, issue 27).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator, Mapping

from proxy import metrics
from proxy.engine.ledger import Ledger
from proxy.engine.pace import SHARED
from proxy.engine.room import PipelineLimits, Room
from proxy.errors import Problem

LATE_SHARE = 0.95
"""A request that fails after this share of its budget ran out of time (a 504, or cancelled
at its deadline by whoever enforced it)."""
SHED_FROM = SHARED
"""Requests of a pipeline in flight before one may be refused for its budget: a pipeline
with one request in flight has cores to spare."""


class Admission:
    def __init__(
        self,
        max_requests: int,
        max_bytes: int,
        max_request_bytes: int,
        pipelines: Mapping[str, PipelineLimits] | None = None,
        *,
        busy_background: int | None = None,
        quiet_s: float = 1.0,
        shed_late: bool = True,
    ) -> None:
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.max_request_bytes = max_request_bytes
        self.bytes_in_flight = 0
        self._requests = 0
        self._limits = dict(pipelines or {})
        self.shed_late = shed_late
        """Whether a request is refused for its budget (PROXY_SHED_LATE)."""
        self._rooms: dict[str, Room] = {}
        """Per pipeline, what it holds of its limits, who waits, and its pace."""
        self._background: dict[str, tuple[int, int]] = {}
        """Per pipeline, the background requests running and their pixels."""
        self._freed = asyncio.Event()
        self.busy_background = busy_background or max_requests
        """Background requests at once while clients wait (by default no fewer than
        otherwise: the share of `max_requests` bounds them first)."""
        self.quiet_s = quiet_s
        self._clients = 0
        """Requests whose clients wait, running now."""
        self._last_client = float("-inf")
        """When the last of them ended (monotonic)."""
        alive = weakref.ref(self)
        self.sets_gauges = not (
            metrics.read_when_scraped(metrics.IN_FLIGHT, lambda: _read(alive, "_requests"))
            and metrics.read_when_scraped(
                metrics.BYTES_IN_FLIGHT, lambda: _read(alive, "bytes_in_flight")
            )
        )
        """Whether the in-flight gauges are written on every change (several workers)."""

    def _busy_for(self) -> float:
        """How long the proxy stays busy with clients that wait, if none comes (0: quiet)."""
        if self._clients:
            return self.quiet_s
        return max(0.0, self._last_client + self.quiet_s - time.monotonic())

    def check_room(self) -> None:
        """Before taking a request on: 503 when the proxy holds its budget of bytes."""
        if self.bytes_in_flight >= self.max_bytes:
            raise self.full()

    def full(self) -> Problem:
        """The 503 of a proxy holding its budget of bytes (check_room, Ledger.hold_upload)."""
        return Problem(
            503,
            f"proxy at capacity ({self.bytes_in_flight >> 20} MiB of requests in flight, "
            f"limit {self.max_bytes >> 20} MiB)",
        )

    async def wait_background(self, pipeline: str, pixels: int, share: float) -> None:
        """Until a background request (a job) of `pipeline` fits within `share` of the
        proxy's and the pipeline's limits, counting the other background requests only: the
        rest is left to requests whose clients wait, so a backlog never starves them."""
        limits = self._limits.get(pipeline, PipelineLimits())
        while True:
            running = self._background.get(pipeline, (0, 0))
            requests = sum(n for n, _ in self._background.values())
            fits = (
                requests < max(1, int(self.max_requests * share))
                and _fits(running[0], 1, limits.max_in_flight, share)
                and (not running[1] or _fits(running[1], pixels, limits.max_pixels, share))
            )
            busy_for = self._busy_for()
            if fits and (not busy_for or requests < self.busy_background):
                break
            self._freed.clear()
            if not fits:
                await self._freed.wait()
                continue
            # Held back only by the clients: look again once they may have gone quiet.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(busy_for):
                    await self._freed.wait()
        n, held = self._background.get(pipeline, (0, 0))
        self._background[pipeline] = (n + 1, held + pixels)

    def background_done(self, pipeline: str, pixels: int) -> None:
        n, held = self._background[pipeline]
        self._background[pipeline] = (n - 1, held - pixels)
        self._freed.set()

    def room(self, pipeline: str) -> Room:
        room = self._rooms.get(pipeline)
        if room is None:
            limits = self._limits.get(pipeline, PipelineLimits())
            room = self._rooms[pipeline] = Room(pipeline, limits, paced=self.shed_late)
        return room

    @contextlib.asynccontextmanager
    async def admit(
        self, pipeline: str, pixels: int, background: bool = False, left_s: float | None = None
    ) -> AsyncIterator[None]:
        """Room for one request of `pipeline` with an image of `pixels`, for as long as it
        runs; 503 at once when the proxy is at its limits, or when the work ahead would
        outlast `left_s`, the seconds left of its budget (engine/pace.py). At the pipeline's
        own limits a client's request waits for room while it would still be answered in
        time (`_wait`, engine/room.py).
        `background`: a job's, admitted after wait_background (not a client that waits)."""
        if self._requests >= self.max_requests:
            raise Problem(503, f"proxy at capacity ({self.max_requests} requests in flight)")
        room = self.room(pipeline)
        if room.line or not room.fits(pixels):
            entered = time.monotonic()
            await self._wait(room, pixels, background, left_s)
            if left_s is not None:  # what is left of it to run in
                left_s -= time.monotonic() - entered
        else:
            if room.pace is not None:
                self._paced(room, pixels, background, left_s)
            room.in_flight += 1
            room.pixels += pixels
            self._count_in(background)
        pace = room.pace
        token = 0 if pace is None else pace.started(max(pixels, 1))
        started, answered = (0.0 if pace is None else time.monotonic()), True
        try:
            yield
        except BaseException:
            # Out of time (504, or cancelled at its deadline): the pipeline did not get its
            # work through. Other failures and hang-ups say nothing of its pace.
            late = left_s is not None and time.monotonic() - started >= left_s * LATE_SHARE
            answered = False if late else None
            raise
        finally:
            if pace is not None:
                pace.ended(token, answered)
            self._give_back(room, pixels, background)

    def _count_in(self, background: bool) -> None:
        self._requests += 1
        if self.sets_gauges:
            metrics.IN_FLIGHT.inc()
        if not background:
            self._clients += 1

    def _give_back(self, room: Room, pixels: int, background: bool) -> None:
        if not background:
            self._clients -= 1
            self._last_client = time.monotonic()
        if self.sets_gauges:
            metrics.IN_FLIGHT.dec()
        self._requests -= 1
        room.in_flight -= 1
        room.pixels -= pixels
        if room.line:
            self._serve(room)

    def _serve(self, room: Room) -> None:
        """Room handed to the requests waiting for it, in the order they came; those the
        work ahead would now outlast are told so (503) rather than left to time out."""
        now = time.monotonic()
        for waiter in room.let_in(now):
            self._count_in(waiter.background)
        if room.line:
            room.tell_late(now)

    async def _wait(self, room: Room, pixels: int, background: bool, left_s: float | None) -> None:
        """Until the pipeline has room for this request, those that came before it served
        first (its room is reserved as it is handed over); 503 at once when it may not wait
        (no budget, the line full, no pace known yet) or the work ahead would outlast its
        budget, or later when the pipeline's pace says so (Room.tell_late; never a job's);
        504 when its budget ends first."""
        pace = None if background else room.pace  # a job waits its turn whatever the pace
        # With no pace known yet nothing says how long the line would take: 32 clients
        # sending 6000x6000 photos to `digits` (one at a time) waited, let in to time out.
        if left_s is None or not room.takes_waiters() or (pace is not None and not pace.known):
            raise room.at_capacity()
        if pace is not None:
            expected = pace.queued_s(max(pixels, 1), room.queued)
            if expected is not None and expected > left_s:
                raise room.late(expected, left_s)
        waiter = room.join(pixels, background, time.monotonic() + left_s)
        try:
            async with asyncio.timeout(left_s):
                await waiter.room
        except BaseException as exc:
            if room.leave(waiter):
                self._serve(room)  # the first in line gone: the next may fit
            elif waiter.handed():  # its room came as it was cancelled: given back
                self._give_back(room, pixels, background)
            if isinstance(exc, TimeoutError):
                raise Problem(
                    504,
                    f"pipeline '{room.name}' had no room for the request within its budget "
                    f"({left_s:.2f} s; {len(room.line)} waiting)",
                ) from None
            raise

    def _paced(self, room: Room, pixels: int, background: bool, left_s: float | None) -> None:
        """503 at once when the work ahead of a request of `pixels` with `left_s` of its
        budget would outlast it (engine/pace.py)."""
        pace = room.pace
        if left_s is None or background or pace is None or pace.running < SHED_FROM:
            return
        expected = pace.expected_s(max(pixels, 1))
        if expected is not None and expected > left_s:
            raise room.late(expected, left_s)

    def ledger(self) -> Ledger:
        return Ledger(self)


def _read(alive: weakref.ref[Admission], name: str) -> float:
    """A gauge's value read off the admission it follows (0 once that is gone)."""
    admission = alive()
    return 0 if admission is None else getattr(admission, name)


def _fits(held: int, more: int, limit: int | None, share: float) -> bool:
    return limit is None or held + more <= max(1, int(limit * share))
