"""What the proxy lets in: requests in flight, the bytes they hold, and per pipeline the
requests and image pixels it works on at once.

Bytes count from the first byte of an upload to the last tensor a request keeps, so a
flood of large requests is shed at the door (503 + Retry-After) while the proxy still
has the memory to answer the requests it took. A pipeline's own limits keep what it
takes within its budget: 32 clients sending 3000x3000 pages used to be taken all at once
and 3 of 65 were answered in time; beyond a pipeline's megapixels in flight the rest are
told at once to come back.

Background requests (jobs) wait for room instead, within a share of those limits; and while
clients that wait are being served, or were within `quiet_s`, at most `busy_background` of
them run at once. The services' cores are shared: on two cores a 1,000-page OCR backlog run
eight at a time cost digits 2.6x its p99 at c=8, one at a time 1.5x (bench/README, issue 27).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from proxy import metrics
from proxy.engine.pace import SHARED, Pace
from proxy.errors import Problem

LATE_SHARE = 0.95
"""A request that fails after this share of its budget ran out of time (a 504, or cancelled
at its deadline by whoever enforced it)."""
SHED_FROM = SHARED
"""Requests of a pipeline in flight before one may be refused for its budget: a pipeline
with one request in flight has cores to spare."""
MOST_WAIT_S = 30
"""The longest Retry-After a pipeline at its limits tells: a pace read from little (one
stalled request, nothing answered for long) may say hours."""


@dataclass(frozen=True)
class PipelineLimits:
    max_in_flight: int | None = None
    max_pixels: int | None = None


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
        self._in_flight: dict[str, int] = {}
        self._pixels: dict[str, int] = {}
        self._pace: dict[str, Pace] = {}
        """Per pipeline, its work in flight and how fast it answers (engine/pace.py)."""
        self.shed_late = shed_late
        """Whether a request is refused for its budget (PROXY_SHED_LATE)."""
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

    @contextlib.asynccontextmanager
    async def admit(
        self, pipeline: str, pixels: int, background: bool = False, left_s: float | None = None
    ) -> AsyncIterator[None]:
        """Room for one request of `pipeline` with an image of `pixels`, for as long as it
        runs; 503 at once when the proxy's or the pipeline's limits are reached (an image
        larger than the whole pixel budget may still pass alone), or when the work ahead
        would outlast `left_s`, the seconds left of its budget (engine/pace.py).
        `background`: a job's, admitted after wait_background (not a client that waits)."""
        limits = self._limits.get(pipeline, PipelineLimits())
        if self._requests >= self.max_requests:
            raise Problem(503, f"proxy at capacity ({self.max_requests} requests in flight)")
        running = self._in_flight.get(pipeline, 0)
        if limits.max_in_flight is not None and running >= limits.max_in_flight:
            raise Problem(
                503,
                f"pipeline '{pipeline}' at capacity ({running} requests in flight)",
                retry_after=self._room_in(pipeline),
            )
        held = self._pixels.get(pipeline, 0)
        if limits.max_pixels is not None and held and held + pixels > limits.max_pixels:
            raise Problem(
                503,
                f"pipeline '{pipeline}' at capacity ({held / 1e6:.1f} of "
                f"{limits.max_pixels / 1e6:g} megapixels in flight)",
                retry_after=self._room_in(pipeline),
            )
        # Kept only while shedding is on: off, a request pays nothing for it.
        pace = self._paced(pipeline, pixels, background, left_s) if self.shed_late else None
        self._requests += 1
        self._in_flight[pipeline] = running + 1
        self._pixels[pipeline] = held + pixels
        token = 0 if pace is None else pace.started(max(pixels, 1))
        if self.sets_gauges:
            metrics.IN_FLIGHT.inc()
        if not background:
            self._clients += 1
        started, late = (0.0 if pace is None else time.monotonic()), False
        try:
            yield
        except BaseException:
            # Out of time (504, or cancelled at its deadline): the pipeline did not get its
            # work through. Other failures and hang-ups say nothing of its pace.
            if pace is not None and left_s is not None:
                late = time.monotonic() - started >= left_s * LATE_SHARE
            raise
        finally:
            if not background:
                self._clients -= 1
                self._last_client = time.monotonic()
            if self.sets_gauges:
                metrics.IN_FLIGHT.dec()
            self._requests -= 1
            self._in_flight[pipeline] -= 1
            self._pixels[pipeline] -= pixels
            if pace is not None:
                pace.ended(token, answered=not late)

    def _room_in(self, pipeline: str) -> str | None:
        """Retry-After for a pipeline at its limits: the seconds until its first request in
        flight is expected to end (engine/pace.py), 1 to MOST_WAIT_S; None (the default,
        1 s) while its pace is not known. Four clients sending 7 Mpx scans to `ocr` were
        told 1 s, and came back while the three pages it held needed ~7 s more."""
        pace = self._pace.get(pipeline)
        wait_s = None if pace is None else pace.next_end_s()
        return None if wait_s is None else str(min(MOST_WAIT_S, max(1, math.ceil(wait_s))))

    def _paced(self, pipeline: str, pixels: int, background: bool, left_s: float | None) -> Pace:
        """The pipeline's pace, once a request of `pixels` with `left_s` of its budget is
        judged to fit: 503 at once when the work ahead would outlast it (engine/pace.py)."""
        pace = self._pace.get(pipeline) or self._pace.setdefault(pipeline, Pace())
        if left_s is None or background or pace.running < SHED_FROM:
            return pace
        expected = pace.expected_s(max(pixels, 1))
        if expected is None or expected <= left_s:
            return pace
        metrics.SHED.labels(pipeline).inc()
        if math.isinf(expected):
            ahead, wait_s = "none of its recent requests was answered in time", 1
        else:
            # Come back once the work ahead, were none added, would fit this budget.
            ahead = f"~{expected:.2f} s of work ahead at its pace now"
            wait_s = max(1, math.ceil(expected - left_s))
        raise Problem(
            503,
            f"pipeline '{pipeline}' would not answer within the request's budget: "
            f"{ahead}, {left_s:.2f} s left",
            retry_after=str(wait_s),
        )

    def ledger(self) -> Ledger:
        return Ledger(self)


def _read(alive: weakref.ref[Admission], name: str) -> float:
    """A gauge's value read off the admission it follows (0 once that is gone)."""
    admission = alive()
    return 0 if admission is None else getattr(admission, name)


def _fits(held: int, more: int, limit: int | None, share: float) -> bool:
    return limit is None or held + more <= max(1, int(limit * share))


class Ledger:
    """The bytes one request holds; released together when it ends."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.held = 0

    def hold(self, nbytes: int) -> None:
        if self.held + nbytes > self.admission.max_request_bytes:
            raise Problem(
                413,
                f"the request's tensors would exceed {self.admission.max_request_bytes >> 20} "
                "MiB (PROXY_MAX_REQUEST_MB)",
            )
        self.held += nbytes
        self.admission.bytes_in_flight += nbytes
        if self.admission.sets_gauges:
            metrics.BYTES_IN_FLIGHT.set(self.admission.bytes_in_flight)

    def hold_upload(self, nbytes: int) -> None:
        """`hold` for bytes a client is still sending, refused (503 + Retry-After) when the
        proxy would pass its bytes in flight. The room is checked as each request starts,
        but requests that start together each find it: 64 OCR pages of 17.7 MiB sent at
        once took a proxy whose bound was 256 MiB to 2 GiB. The connection stays open: the
        server drops the rest of the body unread and unkept, and the client, which sends
        it all before it reads, gets the 503 (closed, it got a reset: 44 of 64). An upload
        larger than the bound passes while it is alone, as an image larger than a pipeline's
        pixel budget does (its own limits still hold: PROXY_MAX_REQUEST_MB, the body's)."""
        admission = self.admission
        others = admission.bytes_in_flight - self.held
        if others and admission.bytes_in_flight + nbytes > admission.max_bytes:
            raise admission.full()
        self.hold(nbytes)

    def release(self, nbytes: int) -> None:
        nbytes = min(nbytes, self.held)
        self.held -= nbytes
        self.admission.bytes_in_flight -= nbytes
        if self.admission.sets_gauges:
            metrics.BYTES_IN_FLIGHT.set(self.admission.bytes_in_flight)

    def close(self) -> None:
        self.release(self.held)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
