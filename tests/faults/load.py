"""Bounded closed-loop load that counts every answer; nothing may be lost or hang."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bench.httpload import Connection, post_bytes


@dataclass
class Tally:
    sent: int = 0
    by_status: Counter = field(default_factory=Counter)
    lost: int = 0
    """Requests that raised on the client side (connection dropped, no answer)."""
    hung: int = 0
    """Requests with no answer by their deadline plus the margin."""
    latencies: list[float] = field(default_factory=list)
    timeline: list[tuple[float, int]] = field(default_factory=list)
    bodies: dict[int, list[bytes]] = field(default_factory=dict)
    """The first few answers of each status but 200, as sent: an assertion on statuses shows
    them (the error names the step and carries the request id, to find in the mesh's logs)."""

    def count(self, status: int, body: bytes) -> None:
        self.by_status[status] += 1
        if status != 200 and len(kept := self.bodies.setdefault(status, [])) < 3:
            kept.append(body[:500])

    def p99_ms(self) -> float:
        return float(np.percentile(self.latencies, 99) * 1000) if self.latencies else 0.0

    def summary(self, name: str) -> str:
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(self.by_status.items()))
        return (
            f"{name}: sent {self.sent}, answered {{{statuses}}}, lost {self.lost}, "
            f"hung {self.hung}, p99 {self.p99_ms():.0f} ms"
        )


async def run(
    url: str,
    path: str,
    body: bytes,
    *,
    requests: int,
    concurrency: int,
    min_duration_s: float = 0.0,
    timeout_ms: float,
    margin_s: float = 1.0,
    on_progress: Callable[[int], None] | None = None,
    headers: dict[str, str] | None = None,
    budget_ms: Callable[[], int] | None = None,
) -> Tally:
    """Closed loop over keep-alive connections (a lean client: httpx's own CPU cost would
    starve the mesh on two cores and show up as latency): at least `requests` requests, and
    for at least `min_duration_s` (a fault injected at a given second must find the load
    still running, however fast the mesh answers). `budget_ms`: each request's own budget
    (X-Request-Timeout-Ms) instead of `timeout_ms`."""
    tally = Tally()
    start = time.monotonic()
    next_index = 0

    def request() -> tuple[bytes, float]:
        budget = timeout_ms if budget_ms is None else budget_ms()
        extra = {"X-Request-Timeout-Ms": str(budget), **(headers or {})}
        return post_bytes(url + path, body, "image/png", extra), budget / 1000 + margin_s

    fixed = request() if budget_ms is None else None

    async def worker() -> None:
        nonlocal next_index
        conn = await Connection.open(url)
        try:
            while next_index < requests or time.monotonic() - start < min_duration_s:
                index = next_index
                next_index += 1
                if on_progress is not None:
                    on_progress(index)
                tally.sent += 1
                raw, wait_s = fixed or request()
                t0 = time.monotonic()
                try:
                    status, answer = await asyncio.wait_for(conn.request(raw), wait_s)
                except TimeoutError:
                    tally.hung += 1
                    await conn.close()
                    conn = await Connection.open(url)
                    continue
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    tally.lost += 1
                    conn = await Connection.open(url)
                    continue
                tally.count(status, answer)
                tally.latencies.append(time.monotonic() - t0)
                tally.timeline.append((t0 - start, status))
        finally:
            await conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tally


async def impatient(
    url: str,
    path: str,
    body: bytes,
    *,
    clients: int,
    duration_s: float,
    budgets_ms: tuple[int, int] = (3, 25),
    seed: int = 0,
) -> Tally:
    """Clients whose every request carries a budget of a few milliseconds (drawn in
    `budgets_ms`), so that most end at their deadline somewhere inside the mesh."""
    rng = np.random.default_rng(seed)
    return await run(
        url,
        path,
        body,
        requests=0,
        concurrency=clients,
        min_duration_s=duration_s,
        timeout_ms=budgets_ms[1],
        budget_ms=lambda: int(rng.integers(budgets_ms[0], budgets_ms[1] + 1)),
    )


async def hang_ups(
    url: str,
    path: str,
    body: bytes,
    *,
    clients: int,
    duration_s: float,
    wait_ms: tuple[float, float] = (0.0, 15.0),
    seed: int = 1,
) -> int:
    """Clients that send a request, wait a moment (drawn in `wait_ms`), and hang up before
    the answer comes; returns how many hung up."""
    rng = np.random.default_rng(seed)
    raw = post_bytes(url + path, body, "image/png", {"X-Request-Timeout-Ms": "3000"})
    start = time.monotonic()
    count = 0

    async def client() -> None:
        nonlocal count
        while time.monotonic() - start < duration_s:
            conn = await Connection.open(url)
            conn.writer.write(raw)
            await asyncio.sleep(float(rng.uniform(*wait_ms)) / 1000)
            conn.writer.transport.abort()  # gone, answer or not
            count += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return count


def load_with_events(
    url: str,
    path: str,
    body: bytes,
    duration_s: float,
    events: list[tuple[float, Callable[[], None]]],
    after: Callable[[], None],
) -> Tally:
    """Eight closed-loop clients (3 s budgets) for `duration_s`, each event's action run at
    its second from the start (a fault, its healing); `after` once the load and every event
    are done, whatever happened (a fault always healed)."""
    timers = [threading.Timer(at, action) for at, action in events]
    for timer in timers:
        timer.start()
    try:
        return asyncio.run(
            run(
                url,
                path,
                body,
                requests=0,
                concurrency=8,
                timeout_ms=3000,
                min_duration_s=duration_s,
            )
        )
    finally:
        for timer in timers:
            timer.join()
        after()
