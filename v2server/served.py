"""A Runnable served: its batcher, its statistics, its warm-up, its worker threads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor

import numpy as np

from protos.errors import InvalidInput
from v2server.batcher import Batcher
from v2server.model import LoadError, Runnable, Scheduling, TensorSpec
from v2server.statistics import ModelStatistics
from v2server.validation import batch_rows


class ServedModel:
    """One version of one model, as every service serves it."""

    def __init__(self, runnable: Runnable, executor: Executor | None = None) -> None:
        self.runnable = runnable
        self.name: str = runnable.name
        self.version: str = runnable.version
        self.platform: str = runnable.platform
        self.inputs: Sequence[TensorSpec] = runnable.inputs
        self.outputs: Sequence[TensorSpec] = runnable.outputs
        self.labels = runnable.labels
        self.digest: str | None = getattr(runnable, "digest", None)
        """What decides its answers, digested (v2server/triton.py: DIGEST_PARAMETER)."""
        self.decoding: tuple[str, int] | None = getattr(runnable, "decoding", None)
        """(input, min_pixels) of the images the model starts by decoding (a recipe's)."""
        self.reported_config = getattr(runnable, "reported_config", None)
        """The Triton config the model was loaded from, when it has one (v2server/triton.py)."""
        self.scheduling: Scheduling = runnable.scheduling
        self.statistics = ModelStatistics()
        s = self.scheduling
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(
            max_workers=s.instances, thread_name_prefix=f"run-{self.name}"
        )
        merges = s.max_queue_delay_s is not None and s.max_batch_size > 0
        self._batcher = Batcher(
            runnable.run,
            self._executor,
            name=self.name,
            statistics=self.statistics,
            max_batch_rows=s.max_batch_size if merges else 0,
            target_rows=s.preferred_batch_size,
            max_delay_s=s.max_queue_delay_s if s.max_queue_delay_s and merges else 0.0,
            max_queue=s.max_queue,
            instances=s.instances,
            inline_below_s=s.inline_below_s,
            inline_max_bytes=s.inline_max_bytes,
            # Optional: what a request weighs for running on the event loop, beyond its bytes.
            weigh=getattr(runnable, "work_bytes", None),
        )
        self._ready = False
        self._calls = 0
        """Requests in this version now (a retired version finishes them: control.py)."""
        self._idle: asyncio.Future[None] | None = None

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        """Warm up (twice: the second run seeds the batcher's execution-time average)."""
        inputs = self.runnable.warmup_inputs()
        if inputs is not None:
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._executor, self.runnable.run, inputs)
                start = time.perf_counter()
                await loop.run_in_executor(self._executor, self.runnable.run, inputs)
                self._batcher.seed(time.perf_counter() - start)
            except Exception as exc:
                raise LoadError(
                    f"model '{self.name}' version {self.version}: warm-up inference failed "
                    f"({exc}); set `warmup` shapes in its config"
                ) from exc
        self._batcher.start()
        self._ready = True

    async def stop(self) -> None:
        self._ready = False
        await self._batcher.stop()
        if self._own_executor:
            self._executor.shutdown(wait=True)

    async def infer(
        self, inputs: dict[str, np.ndarray], deadline: float | None
    ) -> dict[str, np.ndarray]:
        rows = 0
        if self.scheduling.max_batch_size:
            rows = batch_rows(self.name, inputs)
            if rows == 0:
                raise InvalidInput(f"model '{self.name}': batch has no rows")
        self._calls += 1
        try:
            return await self._batcher.submit(inputs, rows, deadline)
        finally:
            self._calls -= 1
            if not self._calls and self._idle is not None and not self._idle.done():
                self._idle.set_result(None)

    async def drained(self) -> None:
        """Once no request is in this version (a retired version waits for it)."""
        if self._calls:
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle
