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
from dataclasses import dataclass

from proxy import metrics
from proxy.engine.definitions import CallingStep, ParallelStep
from proxy.engine.plan import Plan
from proxy.engine.wiring import Wiring, no_output

log = logging.getLogger("proxy.audit")


@dataclass(frozen=True)
class Calls:
    """One calling step of a pipeline, as the audit checks it."""

    step: CallingStep
    labels: list[str]
    """Its calls' targets: the step's, or `<parallel step>/<branch>` each."""
    read: list[str]
    """Its model's outputs the pipeline reads: asked for by name (`outputs:`), read by the
    answer or a later step, or for a parallel step by `per_branch` and the combination."""


def calls_of(plan: Plan) -> list[Calls]:
    """What the audit checks of `plan`: fixed by its definition, so found once."""
    steps = plan.calling_steps()
    later = {*plan.result_reads, *(r for s in steps for r in s.inputs.values())}
    found = []
    for step in steps:
        read = set(step.outputs)
        if isinstance(step, ParallelStep):
            labels = [f"{step.name}/{b}" for b in plan.branches(step)]
            read |= plan.branch_reads.get(step.name, frozenset())
            read |= {step.combine.tensor} if step.combine.tensor else set()
        else:
            labels = [step.name]
            read |= {t for p, _, t in (r.partition(".") for r in later) if p == step.name}
        found.append(Calls(step, labels, sorted(read)))
    return found


class Audit:
    def __init__(self, plans: dict[str, Plan], wiring: Wiring, every_s: float) -> None:
        self.plans = plans
        self.wiring = wiring
        self.every_s = every_s
        self._calls = {name: calls_of(plan) for name, plan in plans.items()}
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
        for calls in self._calls[plan.name]:
            for label in calls.labels:
                canary = plan.canaries.get(label)
                for target in (plan.targets[label], *([canary.target] if canary else [])):
                    meta = await self.wiring.metadata(target)
                    if meta is None:
                        complete = False
                        continue
                    why = await self.wiring.why_not(plan, calls.step, target)
                    if why is not None:
                        found.append(f"step '{label}': {why}")
                    for tensor in calls.read:
                        if (missing := no_output(label, target, meta, tensor)) is not None:
                            found.append(f"step '{label}': {missing}")
        return found, complete
