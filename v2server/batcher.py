"""Dynamic batching: an object owned by the model, not a patch on it.

Requests wait in a bounded queue. A worker takes the oldest request plus every
queued request with the same per-row signature, up to `max_batch_rows` rows,
waiting at most `max_delay_s` for more; concatenates them along axis 0; runs
the model once in an executor; and splits the result back by row counts.
Callers that left (cancelled, deadline passed) are skipped, never break the
batch, and are never run after their deadline.

The wait is adaptive: it pays while batches hold other requests or requests arrive
closer together than `max_delay_s` (moving averages of both). Otherwise (low load) a
batch closes at once, and a request that finds nothing queued or running is run by its
own caller, with no hand-off to the worker. At c=1 this saves the delay plus a timer
wake-up and a task hop (~1.5-2 ms per call for a 1 ms delay on a small VM). Workers and
callers share `instances` execution slots.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from protos.errors import DeadlineExceeded, InvalidInput, Overloaded, Unavailable
from v2server import metrics
from v2server.statistics import ModelStatistics

log = logging.getLogger("v2server.batcher")

RunFn = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass(eq=False)
class _Pending:
    inputs: dict[str, np.ndarray]
    rows: int
    deadline: float | None
    future: asyncio.Future[dict[str, np.ndarray]]
    arrived_ns: int = field(default_factory=time.perf_counter_ns)
    signature: tuple = field(init=False)

    def __post_init__(self) -> None:
        self.signature = tuple(
            (name, arr.dtype.str, arr.shape[1:]) for name, arr in sorted(self.inputs.items())
        )


class Batcher:
    """Schedules executions of one model version.

    max_batch_rows == 0 runs every request on its own: no worker task, no
    concatenation (each hop between threads costs ~100 us on small VMs), but
    the same bounded queue, deadline checks and concurrency limit.
    """

    def __init__(
        self,
        run: RunFn,
        executor: Executor,
        *,
        name: str,
        max_batch_rows: int,
        max_delay_s: float,
        max_queue: int,
        instances: int = 1,
        inline_below_s: float = 0.0,
        inline_max_bytes: int = 1 << 16,
    ) -> None:
        self._run = run
        self._executor = executor
        self._name = name
        self._max_rows = max_batch_rows
        self._max_delay = max_delay_s
        self._max_queue = max_queue
        self._instances = instances
        self._queue: collections.deque[_Pending] = collections.deque()
        self._arrived = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self._depth = metrics.QUEUE_DEPTH.labels(name)
        self._batch_rows = metrics.BATCH_ROWS.labels(name)
        self._closed = False
        self._slots = asyncio.Semaphore(instances)
        self._waiting = 0
        self._inline_below = inline_below_s
        self._inline_max_bytes = inline_max_bytes
        self._mean_s = float("inf")
        """Moving average of one execution's duration, measured where it runs."""
        self._company = 1.0
        """Moving average of the other requests each batch held; starts as if batching
        pays, as a server that has seen no traffic cannot know."""
        self._gap_cap = 10 * max_delay_s
        self._gap = self._gap_cap
        """Moving average of the time between arrivals (each gap capped, so that a busy
        spell after a quiet one shows within a few arrivals)."""
        self._last_arrival: float | None = None
        self._executing = 0
        """Batches the workers are running."""
        self.statistics = ModelStatistics()

    def seed(self, seconds: float) -> None:
        """Start the execution-time average from a measured run (the warm-up)."""
        self._mean_s = seconds

    def _timed(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        try:
            return self._run(inputs)
        finally:
            elapsed = time.perf_counter() - start
            mean = self._mean_s
            self._mean_s = elapsed if mean == float("inf") else 0.9 * mean + 0.1 * elapsed

    async def _call(
        self, inputs: dict[str, np.ndarray], loop: asyncio.AbstractEventLoop
    ) -> dict[str, np.ndarray]:
        """Run cheap executions on the event loop: a thread hand-off costs more than they do
        (~0.2-0.5 ms on small VMs); everything else goes to the executor."""
        if self._mean_s < self._inline_below and _payload_bytes(inputs) <= self._inline_max_bytes:
            return self._timed(inputs)
        return await loop.run_in_executor(self._executor, self._timed, inputs)

    def start(self) -> None:
        if self._max_rows == 0:
            return
        self._workers = [
            asyncio.create_task(self._work(), name=f"batcher-{self._name}-{i}")
            for i in range(self._instances)
        ]

    async def stop(self) -> None:
        """Fail what is still queued, then stop the workers."""
        self._closed = True
        while self._queue:
            pending = self._queue.popleft()
            if not pending.future.done():
                pending.future.set_exception(Unavailable(f"model '{self._name}' is unloading"))
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._depth.set(0)

    async def submit(
        self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None
    ) -> dict[str, np.ndarray]:
        if self._closed:
            raise Unavailable(f"model '{self._name}' is unloading")
        if self._max_rows and rows > self._max_rows:
            raise InvalidInput(
                f"model '{self._name}': batch of {rows} rows exceeds max_batch_size "
                f"{self._max_rows}"
            )
        if len(self._queue) + self._waiting >= self._max_queue:
            raise Overloaded(
                f"model '{self._name}': queue full ({self._max_queue} requests waiting)"
            )
        if self._max_rows == 0:
            return await self._run_alone(inputs, rows, deadline)
        now = asyncio.get_running_loop().time()
        if self._last_arrival is not None:
            gap = min(now - self._last_arrival, self._gap_cap)
            self._gap = 0.7 * self._gap + 0.3 * gap
        self._last_arrival = now
        idle = not (self._queue or self._executing or self._waiting or self._slots.locked())
        if idle and not self._batching_pays():
            return await self._run_alone(inputs, rows, deadline)
        future: asyncio.Future[dict[str, np.ndarray]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(inputs, rows, deadline, future))
        self._depth.set(len(self._queue))
        self._arrived.set()
        return await future

    async def _run_alone(
        self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None
    ) -> dict[str, np.ndarray]:
        loop = asyncio.get_running_loop()
        self._waiting += 1
        self._depth.set(self._waiting)
        arrived = time.perf_counter_ns()
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
            self._depth.set(self._waiting)
        started = time.perf_counter_ns()
        self.statistics.queue.add(started - arrived)
        try:
            if self._closed:
                raise Unavailable(f"model '{self._name}' is unloading")
            if deadline is not None and deadline <= loop.time():
                raise DeadlineExceeded(f"model '{self._name}': deadline passed while queued")
            outputs = await self._call(inputs, loop)
        finally:
            self._slots.release()
        self.statistics.execution(max(rows, 1), 1, 0, time.perf_counter_ns() - started, 0)
        self._batch_rows.observe(max(rows, 1))
        return outputs

    # ------------------------------------------------------------ worker side

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect(loop)
            if batch:
                await self._execute(batch, loop)

    async def _next_live(self, loop: asyncio.AbstractEventLoop) -> _Pending:
        """The oldest queued request whose caller is still waiting and in time."""
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            pending = self._queue.popleft()
            self._depth.set(len(self._queue))
            if self._alive(pending, loop):
                return pending

    def _alive(self, pending: _Pending, loop: asyncio.AbstractEventLoop) -> bool:
        if pending.future.done():  # caller cancelled
            return False
        if pending.deadline is not None and pending.deadline <= loop.time():
            pending.future.set_exception(
                DeadlineExceeded(f"model '{self._name}': deadline passed while queued")
            )
            return False
        return True

    def _take_compatible(
        self, batch: list[_Pending], rows: int, loop: asyncio.AbstractEventLoop
    ) -> int:
        """Move queued requests that fit the batch into it; return the new row count."""
        signature = batch[0].signature
        kept: collections.deque[_Pending] = collections.deque()
        while self._queue and rows < self._max_rows:
            pending = self._queue.popleft()
            if not self._alive(pending, loop):
                continue
            if pending.signature == signature and rows + pending.rows <= self._max_rows:
                batch.append(pending)
                rows += pending.rows
            else:
                kept.append(pending)
        self._queue.extendleft(reversed(kept))
        self._depth.set(len(self._queue))
        return rows

    async def _collect(self, loop: asyncio.AbstractEventLoop) -> list[_Pending]:
        first = await self._next_live(loop)
        batch = [first]
        rows = self._take_compatible(batch, first.rows, loop)
        close_at = loop.time() + self._max_delay
        while rows < self._max_rows and self._batching_pays():
            remaining = close_at - loop.time()
            if remaining <= 0:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                break
            rows = self._take_compatible(batch, rows, loop)
        self._company = 0.8 * self._company + 0.2 * (len(batch) - 1)
        # Callers may have left while the batch was filling.
        return [p for p in batch if self._alive(p, loop)]

    def _batching_pays(self) -> bool:
        return self._company >= 0.5 or self._gap < self._max_delay

    async def _execute(self, batch: list[_Pending], loop: asyncio.AbstractEventLoop) -> None:
        rows = [p.rows for p in batch]
        self._executing += 1
        try:
            async with self._slots:
                await self._execute_batch(batch, rows, loop)
        except asyncio.CancelledError:
            # Stopped while waiting for a slot: the batch's callers must still get an answer.
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(Unavailable(f"model '{self._name}' is unloading"))
            raise
        finally:
            self._executing -= 1

    async def _execute_batch(
        self, batch: list[_Pending], rows: list[int], loop: asyncio.AbstractEventLoop
    ) -> None:
        started = time.perf_counter_ns()
        for p in batch:
            self.statistics.queue.add(started - p.arrived_ns)
        try:
            if len(batch) == 1:
                merged = batch[0].inputs
            else:
                merged = {
                    name: np.concatenate([p.inputs[name] for p in batch], axis=0)
                    for name in batch[0].inputs
                }
            merged_at = time.perf_counter_ns()
            outputs = await self._call(merged, loop)
            ran_at = time.perf_counter_ns()
            parts = _split(outputs, rows, self._name) if len(batch) > 1 else [outputs]
        except asyncio.CancelledError:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(Unavailable(f"model '{self._name}' is unloading"))
            raise
        except Exception as exc:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
            return
        self.statistics.execution(
            sum(rows),
            len(batch),
            merged_at - started,
            ran_at - merged_at,
            time.perf_counter_ns() - ran_at,
        )
        self._batch_rows.observe(sum(rows))
        for p, part in zip(batch, parts, strict=True):
            if not p.future.done():
                p.future.set_result(part)


def _payload_bytes(inputs: dict[str, np.ndarray]) -> int:
    """Bytes a request carries (for BYTES tensors, their elements' lengths)."""
    total = 0
    for arr in inputs.values():
        if arr.dtype == object:
            total += sum(len(x) if isinstance(x, bytes | str) else 8 for x in arr.reshape(-1))
        else:
            total += arr.nbytes
    return total


def _split(
    outputs: dict[str, np.ndarray], rows: list[int], model: str
) -> list[dict[str, np.ndarray]]:
    total = sum(rows)
    for name, arr in outputs.items():
        if arr.ndim == 0 or arr.shape[0] != total:
            raise RuntimeError(
                f"model '{model}' output '{name}' has shape {arr.shape}, "
                f"which does not split into the batch's {total} rows"
            )
    bounds = np.cumsum(rows)[:-1]
    split = {name: np.split(arr, bounds, axis=0) for name, arr in outputs.items()}
    return [{name: split[name][i] for name in outputs} for i in range(len(rows))]
