"""Every pipeline's wiring checked against its models' metadata in the background, so that a
model swapped for one that does not fit (an endpoint variable re-pointed, a new model version
with other tensors) shows when it is deployed, not when a request meets it.

Triton refuses to load an ensemble whose models do not fit. The proxy keeps serving what
still fits (a `partial` step answers without the branch), fails the calls that do not with
502 "pipeline misconfigured" (wiring.py), and says so here: `proxy_pipeline_misconfigured`
is 1 for the pipeline while any step does not fit (the `MeshPipelineMisconfigured` alert),
and one log line names each problem when it appears and when it is gone. The metadata comes
from the proxy's one catalog (transport/catalog.py), so a check costs no call of its own
while the catalog's answers are fresh."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from proxy import metrics
from proxy.engine.definitions import CallingStep, Entry, ParallelStep, SwitchStep
from proxy.engine.plan import Plan
from proxy.engine.wiring import Wiring, no_output

log = logging.getLogger("proxy.audit")


def calling_steps(entries: list[Entry]) -> Iterator[CallingStep]:
    """Every step that calls models, those in a switch's paths too."""
    for entry in entries:
        step = entry.step
        if isinstance(step, SwitchStep):
            for path in step.paths():
                yield from calling_steps(path)
        elif isinstance(step, CallingStep):
            yield step


class Audit:
    def __init__(self, plans: dict[str, Plan], wiring: Wiring, every_s: float) -> None:
        self.plans = plans
        self.wiring = wiring
        self.every_s = every_s
        self.problems: dict[str, list[str]] = {name: [] for name in plans}
        """Pipeline -> what does not fit, as last checked."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        for name in self.plans:  # a series from the start, 0 while it fits
            metrics.PIPELINE_MISCONFIGURED.labels(name).set(0)
        if self.every_s > 0:
            self._task = asyncio.create_task(self._run(), name="wiring-audit")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        # Soon after start, once the catalog has had time to ask (it answers None, and asks
        # in the background, for a model it does not know yet).
        await asyncio.sleep(min(self.every_s, 2.0))
        while True:
            try:
                await self.check_all()
            except Exception:  # a check that fails is tried again next period
                log.exception("wiring audit failed")
            await asyncio.sleep(self.every_s)

    async def check_all(self) -> None:
        for name, plan in self.plans.items():
            found, complete = await self.check(plan)
            if not found and not complete:
                # A model that cannot say now (its service down, not asked yet): nothing is
                # known to be wrong, nor known to fit. The last verdict stands: an outage is
                # neither "fits again" nor, once over, a problem said a second time.
                continue
            if found != self.problems[name]:
                if found:
                    for problem in found:
                        log.error(
                            "pipeline misconfigured: %s",
                            problem,
                            extra={"fields": {"pipeline": name}},
                        )
                else:
                    log.info("pipeline wiring fits again", extra={"fields": {"pipeline": name}})
            self.problems[name] = found
            metrics.PIPELINE_MISCONFIGURED.labels(name).set(1 if found else 0)

    async def check(self, plan: Plan) -> tuple[list[str], bool]:
        """What of `plan` does not fit its models as their metadata declares them now, and
        whether every model's metadata could be read."""
        found: list[str] = []
        complete = True
        for step in calling_steps(plan.pipeline.steps):
            labels = (
                [f"{step.name}/{b}" for b in plan.branches(step)]
                if isinstance(step, ParallelStep)
                else [step.name]
            )
            read = set(step.outputs)  # asked of the model by name
            if isinstance(step, ParallelStep):  # what per_branch and the combination read
                read |= plan.branch_reads.get(step.name, frozenset())
                read |= {step.combine.tensor} if step.combine.tensor else set()
            else:
                read |= _tensors_of(plan, step.name)
            for label in labels:
                target = plan.targets[label]
                meta = await self.wiring.metadata(target)
                if meta is None:
                    complete = False
                    continue
                why = await self.wiring.why_not(plan, step, target)
                if why is not None:
                    found.append(f"step '{label}': {why}")
                for tensor in sorted(read):
                    if (missing := no_output(label, target, meta, tensor)) is not None:
                        found.append(f"step '{label}': {missing}")
        return found, complete


def _tensors_of(plan: Plan, step: str) -> set[str]:
    """The tensors of call step `step` that the answer or a later step reads."""
    refs = set(plan.result_reads)
    refs.update(r for s in calling_steps(plan.pipeline.steps) for r in s.inputs.values())
    return {tensor for producer, _, tensor in (r.partition(".") for r in refs) if producer == step}
