"""A pipeline resolved for this process: every endpoint variable read, every reference
checked, and what each step leaves for later steps worked out once."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

from proxy.engine import endpoints
from proxy.engine.canaries import Canary
from proxy.engine.definitions import (
    CallingStep,
    CallStep,
    Entry,
    ParallelStep,
    Pipeline,
    SwitchStep,
    parse,
)
from proxy.engine.endpoints import Endpoint
from proxy.engine.references import (
    branch_reads,
    check_made,
    check_ref,
    check_result,
    combined,
    producers,
    references,
)
from proxy.engine.results import Renderer, compiled
from proxy.engine.shadows import Shadow
from proxy.errors import DefinitionError
from proxy.transport.target import Target


def _target(
    variable: str, model: str | None, version: str, env: Mapping[str, str], where: str
) -> Target:
    try:
        ep: Endpoint = endpoints.resolve(variable, env)
    except DefinitionError as exc:
        raise DefinitionError(f"{where}: {exc}") from None
    chosen = ep.model or model
    if not chosen:
        raise DefinitionError(
            f"{where}: no model named (give `model` or {variable}=host:port/model)"
        )
    return Target(
        endpoint=variable, address=ep.address, model=chosen, version=ep.version or version
    )


def _alternate(
    live: Target, suffix: str, env: Mapping[str, str], where: str, default_percent: float | None
) -> tuple[Target, float] | None:
    """A call's shadow or canary (`<VARIABLE>_SHADOW`, `<VARIABLE>_CANARY`) if one is set: its
    own model and version where it names them, else the live call's model."""
    try:
        found = endpoints.alternate(live.endpoint, suffix, env, default_percent)
    except DefinitionError as exc:
        raise DefinitionError(f"{where}: {exc}") from None
    if found is None:
        return None
    ep, percent = found
    return Target(ep.variable, ep.address, ep.model or live.model, ep.version), percent


class Plan:
    """A pipeline with every endpoint resolved and every reference checked."""

    def __init__(self, name: str, pipeline: Pipeline, env: Mapping[str, str]) -> None:
        self.name = name
        self.pipeline = pipeline
        self.targets: dict[str, Target] = {}
        """Call step name, or `<parallel step>/<branch>`, -> target."""
        self.shadows: dict[str, Shadow] = {}
        """Call step name, or `<parallel step>/<branch>`, -> where a copy of its calls goes."""
        self.declared_batches: dict[Target, int] = {}
        """Target -> the rows its `<VARIABLE>_MAX_BATCH_SIZE` says its model takes."""
        self.canaries: dict[str, Canary] = {}
        """Call step name, or `<parallel step>/<branch>`, -> where a share of its calls goes
        instead."""
        self._known: set[str] = set()
        self._asked: dict[str, list[str]] = {}
        """Call step -> the outputs it asks for (empty: all its model has)."""
        self._made: dict[str, list[str]] = {}
        """Parallel step -> the tensors its combination makes."""
        self._fanned: dict[str, list[str]] = {}
        """Parallel step -> the outputs it asks its branches for (empty: all)."""
        self._inputs = set(pipeline.input_names())
        self._env = env
        self._walk(pipeline.steps)
        self.keep_after: dict[int, frozenset[str]] = {}
        """id(step) -> producers ("request" or a step name) whose tensors a later step or
        the result still reads: everything else is dropped once the step is done."""
        for output_name, output in (pipeline.outputs or {}).items():
            where = f"pipeline '{self.name}', output '{output_name}'"
            if output.tensor.partition(".")[0] == "request":
                raise DefinitionError(f"{where}: outputs name a step's tensor, not the request")
            check_ref(output.tensor, self._known, set(), where)
            check_made(output.tensor, self._asked, self._made, where)
        check_result(pipeline.result, self._known, self._inputs, f"pipeline '{self.name}', result")
        result_refs = references(pipeline.result)
        answer = result_refs | {o.tensor for o in (pipeline.outputs or {}).values()}
        self.result_reads = frozenset(r for r in answer if r.partition(".")[0] in self._asked)
        """The references of the answer (the result, the v2 outputs) to a call step's
        tensors: each is checked once the steps have run (Executor: one a step that ran does
        not declare is the pipeline's configuration error, not a null or an empty tensor)."""
        self.branch_reads = {
            step: frozenset(tensors) for step, tensors in branch_reads(pipeline.result).items()
        }
        """Parallel step -> its branches' tensors `per_branch` reads: checked as result_reads."""
        for step, tensors in self.branch_reads.items():
            asked = self._fanned.get(step, [])
            if left := [t for t in sorted(tensors) if asked and t not in asked]:
                raise DefinitionError(
                    f"pipeline '{self.name}', result: per_branch reads {left} of step '{step}''s "
                    f"branches, which it asks for {', '.join(asked)} only (its `outputs`)"
                )
        for ref in result_refs:
            check_made(ref, self._asked, self._made, f"pipeline '{self.name}', result")
        read_later = producers(pipeline.result) | {
            producers(o.tensor).pop() for o in (pipeline.outputs or {}).values()
        }
        self._liveness(pipeline.steps, frozenset(read_later))

    @functools.cached_property
    def every_target(self) -> dict[str, Target]:
        """Every target a call may go to, by label: the steps' own, and their canaries' as
        `<label> (canary)`; what readiness checks and the inference cache's key covers."""
        canaries = {f"{label} (canary)": c.target for label, c in self.canaries.items()}
        return {**self.targets, **canaries}

    @functools.cached_property
    def sorted_targets(self) -> tuple[Target, ...]:
        """Every target, in the order of their labels (a cache key's order)."""
        return tuple(self.every_target[label] for label in sorted(self.every_target))

    @functools.cached_property
    def render(self) -> Renderer:
        """The result template, parsed once: (tensors, branches) -> the answer's `result`."""
        return compiled(self.pipeline.result)

    @functools.cached_property
    def decoders(self) -> tuple[tuple[Target, str], ...] | None:
        """(target, model input) of each call step sent the uploaded image as it came, whose
        decode the admission counts (engine/pixels.py); None when a parallel step is sent it
        (its branches' models are not known before the call)."""
        upload = f"request.{self.pipeline.input}"
        found: list[tuple[Target, str]] = []
        for step in self.calling_steps():
            taken = [name for name, ref in step.inputs.items() if ref == upload]
            if taken and not isinstance(step, CallStep):
                return None
            found += [(self.targets[step.name], name) for name in taken]
        return tuple(found)

    def calling_steps(self, entries: list[Entry] | None = None) -> list[CallingStep]:
        """Every step that calls models (call and parallel steps), those inside a switch's
        paths too."""
        found: list[CallingStep] = []
        for entry in self.pipeline.steps if entries is None else entries:
            step = entry.step
            if isinstance(step, SwitchStep):
                for path in step.paths():
                    found += self.calling_steps(path)
            elif isinstance(step, CallingStep):
                found.append(step)
        return found

    def call_steps(self) -> list[CallStep]:
        """Every call step, those inside a switch's paths too."""
        return [s for s in self.calling_steps() if isinstance(s, CallStep)]

    def branches(self, step: ParallelStep) -> dict[str, Target]:
        prefix = f"{step.name}/"
        return {k[len(prefix) :]: t for k, t in self.targets.items() if k.startswith(prefix)}

    def _walk(self, entries: list[Entry]) -> None:
        for entry in entries:
            step = entry.step
            where = self._claim(step.name)
            for ref in step.reads():
                check_ref(ref, self._known, self._inputs, where)
                check_made(ref, self._asked, self._made, where)
            match step:
                case CallStep():
                    self._call(step, where)
                case ParallelStep():
                    self._parallel(step, where)
                case SwitchStep():
                    self._switch(step, where)
                case _:
                    raise DefinitionError(f"{where}: no plan for step kind {type(step).__name__}")

    def _claim(self, name: str) -> str:
        where = f"pipeline '{self.name}', step '{name}'"
        if name in self._known or name == "request":
            raise DefinitionError(f"{where}: step names must be unique")
        return where

    def _call(self, step: CallStep, where: str) -> None:
        target = _target(step.endpoint, step.model, step.version, self._env, where)
        self._add(step.name, target, where)
        self._known.add(step.name)
        self._asked[step.name] = step.outputs

    def _parallel(self, step: ParallelStep, where: str) -> None:
        branches = {
            b.name: _target(b.endpoint, b.model, b.version, self._env, where) for b in step.branches
        }
        if step.branches_from is not None:
            found = endpoints.with_prefix(step.branches_from.prefix, self._env)
            for branch, ep in found.items():
                model = step.branches_from.model.replace("{branch}", branch)
                branches[branch] = _target(ep.variable, model, "", self._env, where)
        if not branches:
            prefix = step.branches_from.prefix if step.branches_from else None
            raise DefinitionError(
                f"{where}: no branches"
                + (f" (no {prefix}<NAME>_URL variable is set)" if prefix else "")
            )
        if step.combine.op != "collect" and not step.combine.tensor:
            raise DefinitionError(f"{where}: combine '{step.combine.op}' needs `tensor`")
        for branch, target in branches.items():
            self._add(f"{step.name}/{branch}", target, where)
        self._known.add(step.name)
        self._made[step.name] = combined(step.combine)
        self._fanned[step.name] = step.outputs

    def _add(self, label: str, target: Target, where: str) -> None:
        self.targets[label] = target
        called = [target]
        if found := _alternate(target, endpoints.SHADOW, self._env, where, 100.0):
            self.shadows[label] = Shadow(*found)
            called.append(found[0])
        if found := _alternate(target, endpoints.CANARY, self._env, where, None):
            self.canaries[label] = Canary(*found)
            called.append(found[0])
        for each in called:
            try:
                rows = endpoints.declared_batch(each.endpoint, self._env)
            except DefinitionError as exc:
                raise DefinitionError(f"{where}: {exc}") from None
            if rows is not None:
                self.declared_batches[each] = rows

    def _switch(self, step: SwitchStep, where: str) -> None:
        self._known.add(step.name)
        before = set(self._known)
        for path in step.paths():
            self._known = set(before)
            self._walk(path)
        # After a switch only what every path defines is certain; results tolerate the rest.
        self._known = before | {n.split("/")[0] for n in self.targets}

    def _liveness(self, entries: list[Entry], after: frozenset[str]) -> frozenset[str]:
        """Fill keep_after for the steps, given what is needed after them; return what is
        needed before them."""
        for entry in reversed(entries):
            step = entry.step
            self.keep_after[id(step)] = after
            needed = {p for ref in step.reads() for p in producers(ref)}
            if isinstance(step, SwitchStep):
                for path in step.paths():
                    needed |= self._liveness(path, after)
            after = after | needed
        return after


def load(path: Path, env: Mapping[str, str]) -> dict[str, Plan]:
    plans = {}
    for name, pipeline in parse(path).pipelines.items():
        try:
            plans[name] = Plan(name, pipeline, env)
        except DefinitionError as exc:
            raise DefinitionError(f"{path}: {exc}") from exc
    for name, plan in plans.items():
        _check_later(name, plan.pipeline, plans, path)
    return plans


def _check_later(name: str, pipeline: Pipeline, plans: dict[str, Plan], path: Path) -> None:
    """A sync-async pipeline's `later` takes the very request it takes, and answers itself."""
    if pipeline.later is None:
        return
    where = f"{path}: pipeline '{name}': later"
    other = plans.get(pipeline.later)
    if other is None or pipeline.later == name:
        known = ", ".join(sorted(set(plans) - {name}))
        raise DefinitionError(f"{where}: '{pipeline.later}' is no other pipeline (known: {known})")
    if other.pipeline.later is not None:
        raise DefinitionError(f"{where}: '{pipeline.later}' has a `later` of its own")
    if other.pipeline.inputs != pipeline.inputs:
        raise DefinitionError(f"{where}: '{pipeline.later}' takes another kind of request")
