"""Runs one request through a pipeline plan: serial, parallel and switch steps.

One absolute deadline per request (loop time); every call gets what is left of it (or less,
its own timeout_ms). A failing all_or_nothing branch cancels its siblings; a finished or
failed request leaves no call running. A request keeps a tensor only while a later step or its
result still reads it, and every byte it keeps is on its ledger (admission.py).
"""

from __future__ import annotations

import asyncio
import functools
import time

import grpc
import numpy as np

from protos import tracing
from protos.labelled import child
from proxy import metrics
from proxy.engine.cache.caches import Caches
from proxy.engine.cache.keys import step_key, step_key_now
from proxy.engine.canaries import STEP_LATENCY as CANARY_LATENCY
from proxy.engine.combine import combine
from proxy.engine.definitions import (
    CallingStep,
    CallStep,
    Entry,
    ParallelStep,
    SwitchStep,
)
from proxy.engine.run import Run, StepStatus, ms
from proxy.engine.shadows import Shadows
from proxy.engine.step_spans import step_span
from proxy.engine.wiring import Wiring
from proxy.errors import StepError
from proxy.transport.calls import Call, Calls
from proxy.transport.target import Target


class Executor:
    def __init__(self, calls: Calls, caches: Caches | None, wiring: Wiring) -> None:
        self.calls = calls  # the transport's seam: how each call travels is decided behind it
        self.caches = caches  # the data cache of steps marked `cache: true` (None: off)
        self.wiring = wiring  # tells a call refused for the pipeline's wiring from a bad request
        self._specs: dict[tuple[int, str, Target], tuple[CallingStep, Call]] = {}
        self.shadows = Shadows(calls)  # copies of calls sent to candidates, in the background

    async def run(self, run: Run, inputs: dict[str, np.ndarray]) -> Run:
        """The request's tensors through its plan; the inputs are already on its ledger. The
        steps are recorded in `run.steps` as they end, so a failed run still tells them."""
        for name, value in inputs.items():
            run.tensors[f"request.{name}"] = value
        await self._steps(run.plan.pipeline.steps, run)
        if not _all_there(run):  # a few set lookups; the metadata asked only on a miss
            plan = run.plan
            missing = _answered(run, [r for r in sorted(plan.result_reads) if r not in run.tensors])
            for step, tensors in plan.branch_reads.items():
                for branch, outputs in run.branches.get(step, {}).items():
                    missing += [
                        (f"{step}/{branch}", t) for t in sorted(tensors) if t not in outputs
                    ]
            if missing and (failed := await self.wiring.undeclared(run, missing)) is not None:
                _failed(run, failed.step, failed.message)
                raise failed
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
        try:
            feeds = {name: run.resolve(ref, label) for name, ref in step.inputs.items()}
        except StepError as exc:  # a tensor not there: the definition's fault, or the path's
            missing = _answered(run, [r for r in step.inputs.values() if r not in run.tensors])
            raise (await self.wiring.undeclared(run, missing, label) or exc) from None
        variant = None
        if (canary := run.plan.canaries.get(label)) is not None:
            variant = "live"
            if canary.takes(run.request_id, label):
                variant, target = "canary", canary.target
        spec = self._spec(step, label, target)
        with step_span(label, target) if tracing.ENABLED else tracing.NO_SPAN as span:
            start = time.perf_counter()
            status, error, how = "ok", None, None
            try:
                if not (isinstance(step, CallStep) and step.cache and self.caches is not None):
                    outputs = await self.calls.call(spec, feeds, run.deadline, run.request_id)
                else:
                    outputs, how = await self._cached(run, step, target, spec, feeds)
                if (shadow := run.plan.shadows.get(label)) is not None:
                    budget_s = run.plan.pipeline.timeout_ms / 1000
                    args = (spec, feeds, outputs, budget_s, run.request_id)
                    self.shadows.copy(run.plan.name, label, shadow, *args)
                return outputs
            except StepError as exc:
                failed = await self.wiring.explained(exc, run.plan, step, run.deadline, target)
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
                run.steps.append(StepStatus(label, status, latency, error, how, since, variant))
                if variant is not None:
                    CANARY_LATENCY.labels(run.plan.name, label, variant, status).observe(
                        latency / 1000
                    )
                if span is not None:
                    span.set_attribute("mesh.status", status)
                    if how is not None:
                        span.set_attribute("mesh.cache", how)
                if label == step.name:  # a branch's once its answer is judged (_parallel)
                    _observe(run, step.name, run.steps[-1])

    async def _cached(
        self, run: Run, step: CallStep, target: Target, spec: Call, feeds: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], str | None]:
        """A step's outputs through its data cache, and how they came (`hit`, `miss`; None:
        the inputs are not keyed, so not cached)."""
        call = functools.partial(self.calls.call, spec, feeds, run.deadline, run.request_id)
        caches = self.caches
        assert caches is not None
        key = step_key_now(target, tuple(step.outputs), caches.prints, feeds)  # no await: most
        if key is None:
            key = await step_key(target, step.outputs, caches.prints, feeds)
        if key is None:
            return await call(), None
        return await caches.step(run.plan.name, step.name).answer(key, call, run.deadline)

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
        first = len(run.steps)
        # The span is current as the branches' tasks are made: theirs are its children.
        with step_span(step.name, None) if tracing.ENABLED else tracing.NO_SPAN as span:
            try:
                await self._branches(step, run)
            finally:
                # Under the status each ended with, an answer the combination refused
                # (_failed) included: a branch answering NaN fails, in the metric too.
                prefix = f"{step.name}/"
                for status in run.steps[first:]:
                    if status.name.startswith(prefix):
                        _observe(run, step.name, status)
                        if span is not None and status.status != "ok":
                            # Its own span ended "ok" if the combination refused its answer.
                            why = f"{status.status}: {status.error}"[:300]
                            span.set_attribute(f"mesh.branch.{status.name[len(prefix) :]}", why)
                if span is not None and run.steps[-1].name == step.name:
                    span.set_attribute("mesh.status", run.steps[-1].status)

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


def _all_there(run: Run) -> bool:
    """Whether every call step's tensor and branch output the result reads is there."""
    plan = run.plan
    if not run.tensors.keys() >= plan.result_reads:
        return False
    for step, tensors in plan.branch_reads.items():
        for outputs in run.branches.get(step, {}).values():
            if not outputs.keys() >= tensors:
                return False
    return True


def _answered(run: Run, refs: list[str]) -> list[tuple[str, str]]:
    """The (step, tensor) of each reference whose step answered (not one a switch skipped)."""
    if not refs:
        return []
    ran = {s.name for s in run.steps if s.status == "ok"}
    pairs = [ref.partition(".") for ref in refs]
    return [(step, tensor) for step, _, tensor in pairs if step in ran]


def _failed(run: Run, label: str, why: str) -> None:
    """A call that answered, its answer refused after all (combine.misfits)."""
    for status in reversed(run.steps):
        if status.name == label:
            status.status, status.error = "internal", why
            return


def _observe(run: Run, step: str, status: StepStatus) -> None:
    branch = status.name.partition("/")[2]  # "<parallel step>/<branch>"
    child(metrics.STEP_LATENCY, run.plan.name, step, branch, status.status).observe(
        status.latency_ms / 1000
    )
