"""Dynamic batching: an object owned by the served model, not a patch on it.

Requests wait in a bounded queue (v2server/batchqueue.py). A worker takes the oldest
request plus every queued request with the same per-row signature, up to
`max_batch_rows` rows, waiting at most `max_delay_s` for more, as long as waiting pays
(v2server/policy.py); concatenates them along axis 0; runs the model once in an executor;
and splits the result back by row counts. Callers that left (cancelled, deadline passed)
are skipped, never break the batch, and are never run after their deadline. Workers and
callers that run alone share `instances` execution slots.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np

from protos.errors import DeadlineExceeded, InvalidInput, Overloaded, Unavailable
from v2server import batchmetrics, spans
from v2server.batchqueue import Pending, RequestQueue, fail
from v2server.policy import AdaptivePolicy
from v2server.statistics import ModelStatistics

RunFn = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


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
        target_rows: int = 0,
        max_queue: int,
        instances: int = 1,
        inline_below_s: float = 0.0,
        inline_max_bytes: int = 1 << 16,
        weigh: Callable[[dict[str, np.ndarray]], int] | None = None,
        statistics: ModelStatistics | None = None,
    ) -> None:
        self._run = run
        self._executor = executor
        self._name = name
        self._max_rows = max_batch_rows
        self._target_rows = min(target_rows or max_batch_rows, max_batch_rows)
        """Rows at which a batch stops waiting for company (Triton's preferred size)."""
        self._max_queue = max_queue
        self._instances = instances
        self._queue = RequestQueue(name)
        self._policy = AdaptivePolicy(max_delay_s, inline_below_s, inline_max_bytes, weigh)
        self._slots = asyncio.Semaphore(instances)
        self._workers: list[asyncio.Task[None]] = []
        self._closed = False
        self._waiting = 0
        """Callers running alone that wait for a slot."""
        self._executing = 0
        """Batches the workers are running."""
        self._batch_rows = batchmetrics.BATCH_ROWS.labels(name)
        self.statistics = statistics if statistics is not None else ModelStatistics()

    def seed(self, seconds: float) -> None:
        """Start the execution-time average from a measured run (the warm-up)."""
        self._policy.seed(seconds)

    def _unloading(self) -> Unavailable:
        return Unavailable(f"model '{self._name}' is unloading")

    async def _call(
        self, inputs: dict[str, np.ndarray], loop: asyncio.AbstractEventLoop
    ) -> dict[str, np.ndarray]:
        if self._policy.runs_inline(inputs):
            return self._policy.timed(self._run, inputs)
        return await loop.run_in_executor(self._executor, self._policy.timed, self._run, inputs)

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
        fail(self._queue.drain(), self._unloading())
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._queue.show_depth()

    async def submit(
        self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None
    ) -> dict[str, np.ndarray]:
        if self._closed:
            raise self._unloading()
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
        loop = asyncio.get_running_loop()
        self._policy.arrived(time.perf_counter())
        idle = not (self._queue or self._executing or self._waiting or self._slots.locked())
        if idle and not self._policy.batching_pays():
            return await self._run_alone(inputs, rows, deadline)
        future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        self._queue.push(Pending(inputs, rows, deadline, future, timing=spans.queued()))
        return await future

    async def _run_alone(
        self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None
    ) -> dict[str, np.ndarray]:
        loop = asyncio.get_running_loop()
        timing = spans.queued()
        arrived = time.perf_counter_ns()
        if self._slots.locked():
            self._waiting += 1
            self._queue.show_depth(self._waiting)
            try:
                await self._slots.acquire()
            finally:
                self._waiting -= 1
                self._queue.show_depth(self._waiting)
        else:  # a slot is free: taken at once, nothing waited (no queue depth to show)
            await self._slots.acquire()
        started = time.perf_counter_ns()
        started_wall = spans.now_ns() if timing is not None else 0
        self.statistics.queue.add(started - arrived)
        try:
            if self._closed:
                raise self._unloading()
            if deadline is not None and deadline <= loop.time():
                raise DeadlineExceeded(f"model '{self._name}': deadline passed while queued")
            outputs = await self._call(inputs, loop)
        finally:
            self._slots.release()
        spans.ran(timing, started_wall, 1, max(rows, 1))
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

    async def _collect(self, loop: asyncio.AbstractEventLoop) -> list[Pending]:
        queue, policy = self._queue, self._policy
        first = await queue.next_live(loop)
        batch = [first]
        rows = queue.take_compatible(batch, first.rows, self._max_rows, loop)
        close_at = loop.time() + policy.max_delay_s
        waited = False
        while rows < self._target_rows and policy.batching_pays():
            remaining = close_at - loop.time()
            if remaining <= 0:
                break
            waited = True
            if not await queue.wait_arrival(remaining):
                break
            rows = queue.take_compatible(batch, rows, self._max_rows, loop)
        policy.closed_batch(len(batch), waited)
        # Callers may have left while the batch was filling.
        return [p for p in batch if queue.alive(p, loop)]

    async def _execute(self, batch: list[Pending], loop: asyncio.AbstractEventLoop) -> None:
        self._executing += 1
        try:
            async with self._slots:
                await self._execute_batch(batch, loop)
        except asyncio.CancelledError:
            # Stopped while waiting for a slot or running: the callers still get an answer.
            fail(batch, self._unloading())
            raise
        finally:
            self._executing -= 1

    async def _execute_batch(self, batch: list[Pending], loop: asyncio.AbstractEventLoop) -> None:
        rows = [p.rows for p in batch]
        started = time.perf_counter_ns()
        traced = any(p.timing is not None for p in batch)
        started_wall = spans.now_ns() if traced else 0
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
        except Exception as exc:
            fail(batch, exc)
            return
        self.statistics.execution(
            sum(rows),
            len(batch),
            merged_at - started,
            ran_at - merged_at,
            time.perf_counter_ns() - ran_at,
        )
        self._batch_rows.observe(sum(rows))
        if traced:
            for p in batch:
                spans.ran(p.timing, started_wall, len(batch), sum(rows))
        for p, part in zip(batch, parts, strict=True):
            if not p.future.done():
                p.future.set_result(part)


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
