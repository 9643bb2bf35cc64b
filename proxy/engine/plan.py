"""A pipeline resolved for this process: every endpoint variable read, every reference
checked, and what each step leaves for later steps worked out once."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proxy.engine import endpoints
from proxy.engine.definitions import (
    CallStep,
    Entry,
    ParallelStep,
    Pipeline,
    SwitchStep,
    parse,
)
from proxy.engine.endpoints import Endpoint
from proxy.engine.results import REFERENCE, Renderer, compiled
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


def _check_ref(ref: str, known: set[str], inputs: set[str], where: str) -> None:
    step, _, tensor = ref.partition(".")
    if not tensor:
        raise DefinitionError(f"{where}: reference '{ref}' must be <step>.<tensor>")
    if step == "request":
        if tensor not in inputs:
            raise DefinitionError(f"{where}: the request has no tensor '{tensor}'")
        return
    if step not in known:
        raise DefinitionError(
            f"{where}: reference '{ref}' names no earlier step "
            f"(known: {', '.join(sorted(known)) or 'none'}); steps may only use earlier outputs"
        )


class Plan:
    """A pipeline with every endpoint resolved and every reference checked."""

    def __init__(self, name: str, pipeline: Pipeline, env: Mapping[str, str]) -> None:
        self.name = name
        self.pipeline = pipeline
        self.targets: dict[str, Target] = {}
        """Call step name, or `<parallel step>/<branch>`, -> target."""
        self._known: set[str] = set()
        self._asked: dict[str, list[str]] = {}
        """Call step -> the outputs it asks for (empty: all its model has)."""
        self._inputs = set(pipeline.input_names())
        self._env = env
        self._walk(pipeline.steps)
        self.keep_after: dict[int, frozenset[str]] = {}
        """id(step) -> producers ("request" or a step name) whose tensors a later step or
        the result still reads: everything else is dropped once the step is done."""
        for name, output in (pipeline.outputs or {}).items():
            where = f"pipeline '{self.name}', output '{name}'"
            if output.tensor.partition(".")[0] == "request":
                raise DefinitionError(f"{where}: outputs name a step's tensor, not the request")
            _check_ref(output.tensor, self._known, set(), where)
        _check_result(pipeline.result, self._known, self._inputs, f"pipeline '{name}', result")
        self.result_reads: tuple[str, ...] = tuple(
            sorted(r for r in _references(pipeline.result) if r.partition(".")[0] in self._asked)
        )
        """The references of the result to a call step's tensors: each is checked once the
        steps have run (Executor: one a step that ran does not declare is the pipeline's
        configuration error, not a null)."""
        for ref in self.result_reads:
            self._check_asked(ref, f"pipeline '{name}', result")
        read_later = _producers(pipeline.result) | {
            _producers(o.tensor).pop() for o in (pipeline.outputs or {}).values()
        }
        self._liveness(pipeline.steps, frozenset(read_later))

    @functools.cached_property
    def sorted_targets(self) -> tuple[Target, ...]:
        """Every target, in the order of their labels (a cache key's order)."""
        return tuple(self.targets[label] for label in sorted(self.targets))

    @functools.cached_property
    def render(self) -> Renderer:
        """The result template, parsed once: (tensors, branches) -> the answer's `result`."""
        return compiled(self.pipeline.result)

    def call_steps(self, entries: list[Entry] | None = None) -> list[CallStep]:
        """Every call step, those inside a switch's paths too."""
        found: list[CallStep] = []
        for entry in self.pipeline.steps if entries is None else entries:
            step = entry.step
            if isinstance(step, CallStep):
                found.append(step)
            elif isinstance(step, SwitchStep):
                for path in step.paths():
                    found += self.call_steps(path)
        return found

    def branches(self, step: ParallelStep) -> dict[str, Target]:
        prefix = f"{step.name}/"
        return {k[len(prefix) :]: t for k, t in self.targets.items() if k.startswith(prefix)}

    def _walk(self, entries: list[Entry]) -> None:
        for entry in entries:
            step = entry.step
            where = self._claim(step.name)
            for ref in step.reads():
                _check_ref(ref, self._known, self._inputs, where)
                self._check_asked(ref, where)
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
        self.targets[step.name] = _target(step.endpoint, step.model, step.version, self._env, where)
        self._known.add(step.name)
        self._asked[step.name] = step.outputs

    def _check_asked(self, ref: str, where: str) -> None:
        """A call step's tensor read that the step does not ask its model for."""
        producer, _, tensor = ref.partition(".")
        match = REFERENCE.match(ref)
        tensor = match["tensor"] if match else tensor
        asked = self._asked.get(producer)
        if asked and tensor not in asked:
            raise DefinitionError(
                f"{where}: reads '{producer}.{tensor}', but step '{producer}' asks its model "
                f"for {', '.join(asked)} only (its `outputs`)"
            )

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
            self.targets[f"{step.name}/{branch}"] = target
        self._known.add(step.name)

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
            needed = {p for ref in step.reads() for p in _producers(ref)}
            if isinstance(step, SwitchStep):
                for path in step.paths():
                    needed |= self._liveness(path, after)
            after = after | needed
        return after


def _check_result(template: Any, known: set[str], inputs: set[str], where: str) -> None:
    """Every reference of the result template names a step (or the request) and one tensor,
    with at most one row index: a reference that could never match answered null, silently
    (`step.out[0][0]` read a tensor named `out[0]`)."""
    if isinstance(template, list):
        for item in template:
            _check_result(item, known, inputs, where)
    elif isinstance(template, dict):
        for key, value in template.items():
            if key == "per_branch" and isinstance(value, str):
                if value not in known:
                    raise DefinitionError(f"{where}: per_branch '{value}' names no step")
            elif key == "fields" and "per_branch" in template and isinstance(value, dict):
                for field, ref in value.items():  # a branch's own tensors: no step before them
                    _check_result(f"b.{ref}", {"b"}, set(), f"{where}, per_branch field '{field}'")
            else:
                _check_result(value, known, inputs, f"{where}.{key}")
    elif isinstance(template, str):
        match = REFERENCE.match(template)
        if match is None or "[" in match["tensor"] or "]" in match["tensor"]:
            raise DefinitionError(
                f"{where}: '{template}' is not a reference <step>.<tensor> or "
                "<step>.<tensor>[<row>] (a result holds references to tensors only)"
            )
        _check_ref(template, known, inputs, where)


def _references(template: Any) -> set[str]:
    """The "step.tensor" references of a result template (row indices dropped; a
    per_branch's fields are its branches' own tensors, not a step's)."""
    if isinstance(template, str):
        match = REFERENCE.match(template)
        return {f"{match['step']}.{match['tensor']}"} if match else set()
    if isinstance(template, list):
        return {r for item in template for r in _references(item)}
    if isinstance(template, dict):
        return {
            r
            for key, value in template.items()
            if not (key == "fields" and "per_branch" in template)
            for r in _references(value)
        }
    return set()


def _producers(template: Any) -> set[str]:
    """Step names (or "request") a reference or a result template reads from."""
    if isinstance(template, str):
        step, dot, _ = template.partition(".")
        return {step} if dot else set()
    if isinstance(template, list):
        return {p for item in template for p in _producers(item)}
    if isinstance(template, dict):
        found = {p for value in template.values() for p in _producers(value)}
        if isinstance(template.get("per_branch"), str):
            found.add(template["per_branch"])
        return found
    return set()


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
