"""Runs one request through a pipeline plan: serial, parallel and switch steps.

One absolute deadline per request (loop time); every call gets what is left of it (or less,
its own timeout_ms). A failing all_or_nothing branch cancels its siblings; a finished or
failed request leaves no call running. A request keeps a tensor only while a later step or its
result still reads it, and every byte it keeps is on its ledger (admission.py).
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from protos import tracing
from protos.codec import content_bytes
from protos.labelled import child
from proxy import metrics
from proxy.engine.admission import Ledger
from proxy.engine.cache.caches import Caches
from proxy.engine.cache.entries import Stored
from proxy.engine.cache.keys import step_key
from proxy.engine.combine import combine
from proxy.engine.definitions import (
    CallingStep,
    CallStep,
    Entry,
    ParallelStep,
    SwitchStep,
)
from proxy.engine.plan import Plan
from proxy.engine.step_spans import step_span
from proxy.engine.wiring import Wiring
from proxy.errors import StepError
from proxy.transport.calls import Call, Calls
from proxy.transport.target import Target


def ms(seconds: float) -> float:
    """Seconds as milliseconds to the microsecond, as round(..., 3) would give them without
    its exact decimal conversion (~2,000 instructions; a `digits` request rounds eleven)."""
    return math.floor(seconds * 1e6 + 0.5) / 1e3


@dataclass
class StepStatus:
    name: str
    status: str
    latency_ms: float
    error: str | None = None
    cache: str | None = None
    """A step with the data cache: `hit` or `miss`."""
    start_ms: float = 0.0
    """When it began, from the moment the proxy took the request (a waterfall's offset)."""


@dataclass
class Run:
    """The state of one request."""

    plan: Plan
    request_id: str
    deadline: float
    ledger: Ledger
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    branches: dict[str, dict[str, dict[str, np.ndarray]]] = field(default_factory=dict)
    steps: list[StepStatus] = field(default_factory=list)
    partial: bool = False
    cache: str | None = None
    """A pipeline with the inference cache: `hit` (stored, or shared with an identical
    request in flight) or `miss`."""
    key: bytes | None = None
    """A hit's inference cache key (its rendered result is kept under it)."""
    origin: float = field(default_factory=time.perf_counter)
    """When the proxy took the request (perf_counter): the steps' `start_ms` count from it."""

    def entry(self) -> Stored | None:
        """What the inference cache keeps of a finished run: a complete answer's tensors."""
        return None if self.partial else Stored(dict(self.tensors), dict(self.branches))

    @classmethod
    def restored(cls, plan: Plan, entry: Stored, ledger: Ledger) -> Run:
        """A run answered from the cache: its tensors, no step run."""
        # Copies of the entry's mappings (the arrays are shared, never written): the entry
        # may answer many requests at once.
        branches = {step: dict(out) for step, out in entry.branches.items()}
        return cls(plan, "", 0.0, ledger, dict(entry.tensors), branches, cache="hit")

    def remaining(self) -> float:
        return self.deadline - asyncio.get_running_loop().time()

    def put(self, ref: str, value: np.ndarray) -> None:
        self.ledger.hold(content_bytes(value))
        self.tensors[ref] = value

    def put_branches(self, step: str, outputs: dict[str, dict[str, np.ndarray]]) -> None:
        self.ledger.hold(sum(content_bytes(v) for out in outputs.values() for v in out.values()))
        self.branches[step] = outputs

    def keep_only(self, producers: frozenset[str]) -> None:
        """Drop every tensor no later step or the result reads (its bytes leave the ledger)."""
        for ref in [r for r in self.tensors if r.partition(".")[0] not in producers]:
            self.ledger.release(content_bytes(self.tensors.pop(ref)))
        for step in [s for s in self.branches if s not in producers]:
            outputs = self.branches.pop(step)
            self.ledger.release(
                sum(content_bytes(v) for out in outputs.values() for v in out.values())
            )

    def resolve(self, ref: str, step: str) -> np.ndarray:
        try:
            return self.tensors[ref]
        except KeyError:
            raise StepError(
                step,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"input '{ref}' was not produced by an earlier step",
            ) from None


class Executor:
    def __init__(self, calls: Calls, caches: Caches | None, wiring: Wiring) -> None:
        self.calls = calls  # the transport's seam: how each call travels is decided behind it
        self.caches = caches  # the data cache of steps marked `cache: true` (None: off)
        self.wiring = wiring  # tells a call refused for the pipeline's wiring from a bad request
        self._specs: dict[tuple[int, str, Target], tuple[CallingStep, Call]] = {}

    async def run(self, run: Run, inputs: dict[str, np.ndarray]) -> Run:
        """The request's tensors through its plan; the inputs are already on its ledger. The
        steps are recorded in `run.steps` as they end, so a failed run still tells them."""
        for name, value in inputs.items():
            run.tensors[f"request.{name}"] = value
        await self._steps(run.plan.pipeline.steps, run)
        return run

    def result(self, run: Run) -> object:
        return run.plan.render(run.tensors, run.branches)

    async def _steps(self, entries: list[Entry], run: Run) -> None:
        for entry in entries:
            step = entry.step
            match step:
                case CallStep():
                    await self._call(step, run)
                case ParallelStep():
                    await self._parallel(step, run)
                case SwitchStep():
                    await self._switch(step, run)
                case _:
                    raise TypeError(f"no executor for step kind {type(step).__name__}")
            run.keep_only(run.plan.keep_after[id(step)])

    async def _invoke(
        self, run: Run, step: CallingStep, label: str, target: Target
    ) -> dict[str, np.ndarray]:
        """One call of a step (`label`: the step, or `<parallel step>/<branch>`), timed and
        recorded under the status it ends with."""
        feeds = {name: run.resolve(ref, label) for name, ref in step.inputs.items()}
        spec = self._spec(step, label, target)
        with step_span(label, target) if tracing.ENABLED else tracing.NO_SPAN as span:
            start = time.perf_counter()
            status, error, how = "ok", None, None
            try:
                if not (isinstance(step, CallStep) and step.cache and self.caches is not None):
                    return await self.calls.call(spec, feeds, run.deadline, run.request_id)
                call = functools.partial(self.calls.call, spec, feeds, run.deadline, run.request_id)
                caches = self.caches
                key = await step_key(target, step.outputs, caches.prints, feeds)
                if key is None:
                    return await call()
                outputs, how = await caches.step(run.plan.name, step.name).answer(
                    key, call, run.deadline
                )
                return outputs
            except StepError as exc:
                failed = await self.wiring.explained(exc, run.plan, step, run.deadline)
                status, error = failed.code.name.lower(), failed.message
                if failed is exc:
                    raise
                raise failed from None
            except asyncio.CancelledError:
                status, error = "cancelled", "cancelled: the request ended first"
                raise
            finally:
                latency = ms(time.perf_counter() - start)
                since = ms(start - run.origin)
                run.steps.append(StepStatus(label, status, latency, error, how, since))
                if span is not None:
                    span.set_attribute("mesh.status", status)
                    if how is not None:
                        span.set_attribute("mesh.cache", how)
                child(metrics.STEP_LATENCY, run.plan.name, step.name, status).observe(
                    latency / 1000
                )

    def _spec(self, step: CallingStep, label: str, target: Target) -> Call:
        """The call a step makes to `target`, made once (kept with the step: its id stays its)."""
        key = (id(step), label, target)
        known = self._specs.get(key)
        if known is None:
            if len(self._specs) >= 4096:  # plans made anew without end: start over
                self._specs.clear()
            per_call_s = None if step.timeout_ms is None else step.timeout_ms / 1000
            spec = Call(label, target, step.outputs, per_call_s, step.retries)
            known = self._specs[key] = (step, spec)
        return known[1]

    async def _call(self, step: CallStep, run: Run) -> None:
        out = await self._invoke(run, step, step.name, run.plan.targets[step.name])
        for name, value in out.items():
            run.put(f"{step.name}.{name}", value)

    async def _parallel(self, step: ParallelStep, run: Run) -> None:
        # The span is current as the branches' tasks are made: theirs are its children.
        with step_span(step.name, None) if tracing.ENABLED else tracing.NO_SPAN:
            await self._branches(step, run)

    async def _branches(self, step: ParallelStep, run: Run) -> None:
        branches = run.plan.branches(step)
        start = time.perf_counter()

        tasks = {
            name: asyncio.create_task(self._invoke(run, step, f"{step.name}/{name}", target))
            for name, target in branches.items()
        }
        try:
            if step.aggregation == "all_or_nothing":
                done, _ = await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_EXCEPTION)
                failed = [t for t in done if t.exception() is not None]
                if failed:
                    raise failed[0].exception()  # type: ignore[misc]
            else:
                await asyncio.wait(tasks.values())
        finally:
            left = []
            for task in tasks.values():
                if not task.done():
                    task.cancel()
                    left.append(task)
                elif not task.cancelled():
                    task.exception()  # read, so that a failure nobody raises is not logged
            if left:  # cancelled siblings must finish (and record their status) first
                await asyncio.gather(*left, return_exceptions=True)
        succeeded = {
            n: t.result() for n, t in tasks.items() if not t.cancelled() and t.exception() is None
        }
        combined, unfit = combine(step.combine, succeeded)
        if unfit:
            for name, why in unfit.items():
                del succeeded[name]
                _failed(run, f"{step.name}/{name}", why)
            if step.aggregation == "all_or_nothing" or not succeeded:
                name, why = next(iter(unfit.items()))
                raise StepError(f"{step.name}/{name}", grpc.StatusCode.INTERNAL, why)
        if not succeeded:
            first = next(t.exception() for t in tasks.values() if not t.cancelled())
            raise StepError(step.name, first.code, f"every branch failed; {first}")  # type: ignore[union-attr]
        if len(succeeded) < len(tasks):
            run.partial = True
        run.put_branches(step.name, succeeded)
        for name, value in combined.items():
            run.put(f"{step.name}.{name}", value)
        latency = ms(time.perf_counter() - start)
        status = "ok" if len(succeeded) == len(tasks) else "partial"
        failed_names = sorted(set(tasks) - set(succeeded))
        run.steps.append(
            StepStatus(
                step.name,
                status,
                latency,
                f"failed branches: {', '.join(failed_names)}" if failed_names else None,
                start_ms=ms(start - run.origin),
            )
        )

    async def _switch(self, step: SwitchStep, run: Run) -> None:
        value = run.resolve(step.input, step.name)
        for case in step.cases:
            if case.when.holds(value):
                chosen = case.steps
                break
        else:
            chosen = step.default
        since = ms(time.perf_counter() - run.origin)
        run.steps.append(StepStatus(step.name, "ok", 0.0, start_ms=since))
        await self._steps(chosen, run)


def _failed(run: Run, label: str, why: str) -> None:
    """A call that answered, its answer refused after all (combine.misfits)."""
    for status in reversed(run.steps):
        if status.name == label:
            status.status, status.error = "internal", why
            return
