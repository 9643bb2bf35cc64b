"""Pipeline definitions (YAML): declarative steps, checked once at start-up.

A reference names a tensor: `request.<input>` for the uploaded body, or
`<step>.<tensor>` for an output of an earlier step (tensor names may contain
dots; step names may not). Referring only to earlier steps rules out cycles.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from protos.strict import Strict
from proxy import endpoints
from proxy.endpoints import Endpoint, Target
from proxy.errors import DefinitionError

_NAME = r"^[A-Za-z0-9_\-]+$"


class Step(Strict):
    """What every kind of step has; `kind` is its YAML key and the suffix of the method
    that handles it (`_call`, `_parallel`, `_switch`): the one dispatch, see `handle`."""

    kind: ClassVar[str]
    name: str = Field(pattern=_NAME)

    def reads(self) -> list[str]:
        """The references this step reads before it runs."""
        raise NotImplementedError


class CallingStep(Step):
    """A step that calls models: what to send, what to ask for, how long, how often."""

    inputs: dict[str, str] = Field(min_length=1)
    """Model input name -> reference."""
    outputs: list[str] = []
    """Outputs to ask for; empty: all of them."""
    timeout_ms: float | None = Field(default=None, gt=0)
    retries: int = Field(default=1, ge=0, le=5)
    """Extra attempts when the endpoint is UNAVAILABLE (inference is idempotent)."""

    def reads(self) -> list[str]:
        return list(self.inputs.values())


class CallStep(CallingStep):
    kind: ClassVar[str] = "call"
    endpoint: str
    """Environment variable holding host:port[/model[/version]]."""
    model: str | None = None
    version: str = ""


class Branch(Strict):
    name: str = Field(pattern=_NAME)
    endpoint: str
    model: str | None = None
    version: str = ""


class BranchesFrom(Strict):
    prefix: str
    """Every `<prefix><BRANCH>_URL` variable becomes a branch named `<branch>`."""
    model: str = "{branch}"
    """Model name template; `{branch}` is replaced (the URL may name the model instead)."""


class Combine(Strict):
    op: Literal["collect", "mean", "vote", "argmax"] = "collect"
    tensor: str | None = None
    """The branch output to combine (mean/argmax: scores; vote: labels)."""
    labels: list[str] | None = None
    """Class names for the combined label (argmax/mean); default: the index."""


class ParallelStep(CallingStep):
    kind: ClassVar[str] = "parallel"
    branches: list[Branch] = []
    branches_from: BranchesFrom | None = None
    aggregation: Literal["all_or_nothing", "partial"] = "all_or_nothing"
    combine: Combine = Combine()


class Condition(Strict):
    empty: bool | None = None
    """True: the tensor has no rows."""
    equals: Any = None
    one_of: list[Any] | None = None


class Case(Strict):
    when: Condition
    steps: list[Entry] = []


class SwitchStep(Step):
    kind: ClassVar[str] = "switch"
    input: str
    """Reference to the tensor the cases look at (its first element for equals/one_of)."""
    cases: list[Case] = Field(min_length=1)
    default: list[Entry] = []

    def reads(self) -> list[str]:
        return [self.input]

    def paths(self) -> list[list[Entry]]:
        """Every list of steps the switch may run: each case's, then the default."""
        return [*(case.steps for case in self.cases), self.default]


class CallEntry(Strict):
    call: CallStep

    @property
    def step(self) -> CallStep:
        return self.call


class ParallelEntry(Strict):
    parallel: ParallelStep

    @property
    def step(self) -> ParallelStep:
        return self.parallel


class SwitchEntry(Strict):
    switch: SwitchStep

    @property
    def step(self) -> SwitchStep:
        return self.switch


Entry = CallEntry | ParallelEntry | SwitchEntry
"""One item of a `steps:` list in YAML: `call:`, `parallel:` or `switch:`."""
Case.model_rebuild()
SwitchStep.model_rebuild()


def handle(handler: object, step: Step, *args: Any) -> Any:
    """Call `handler._<kind>(step, *args)`: how the plan and the executor treat each kind."""
    return getattr(handler, f"_{step.kind}")(step, *args)


class Pipeline(Strict):
    description: str = ""
    input: str = Field(default="image", pattern=_NAME)
    """Name of the request tensor (BYTES [1]) holding the uploaded body."""
    accept: list[Literal["png", "jpeg", "bmp", "webp", "tiff"]] | None = None
    """Image formats the upload may be, told by its first bytes (protos/media.py); any
    other upload gets 415. Unset: the body is passed on whatever it is."""
    timeout_ms: float = Field(default=5000, gt=0)
    """Budget of a request unless X-Request-Timeout-Ms asks for less (or more, up to the cap)."""
    max_in_flight: int | None = Field(default=None, ge=1)
    """Requests of this pipeline served at once; more get 503 with Retry-After at once.
    Beyond what the services can finish within the budget, a queue only turns every
    answer into a 504: shedding the excess keeps the admitted ones in time."""
    max_inflight_mpx: float | None = Field(default=None, gt=0)
    """Megapixels of uploaded images (as their headers declare them) this pipeline may
    work on at once; more get 503 with Retry-After at once. An image's cost grows with its
    pixels: a page photo costs what a hundred text lines do, so a count of requests alone
    cannot keep a crowd of large pages within the budget."""
    steps: list[Entry] = Field(min_length=1)
    result: dict[str, Any]


class PipelineFile(Strict):
    pipelines: dict[str, Pipeline] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _drop_extensions(cls, data: Any) -> Any:
        """Top-level `x-*` keys hold YAML anchors, as in compose files."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not str(k).startswith("x-")}
        return data


def _explain(exc: ValidationError) -> str:
    lines = [
        f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)
    ]
    return "\n  ".join(["invalid pipeline definition:", *lines])


# ---------------------------------------------------------------- resolved plan


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
        self._inputs = {pipeline.input}
        self._env = env
        self._walk(pipeline.steps)
        self.keep_after: dict[int, frozenset[str]] = {}
        """id(step) -> producers ("request" or a step name) whose tensors a later step or
        the result still reads: everything else is dropped once the step is done."""
        self._liveness(pipeline.steps, frozenset(_producers(pipeline.result)))

    def branches(self, step: ParallelStep) -> dict[str, Target]:
        prefix = f"{step.name}/"
        return {k[len(prefix) :]: t for k, t in self.targets.items() if k.startswith(prefix)}

    def _walk(self, entries: list[Entry]) -> None:
        for entry in entries:
            step = entry.step
            where = self._claim(step.name)
            for ref in step.reads():
                _check_ref(ref, self._known, self._inputs, where)
            handle(self, step, where)

    def _claim(self, name: str) -> str:
        where = f"pipeline '{self.name}', step '{name}'"
        if name in self._known or name == "request":
            raise DefinitionError(f"{where}: step names must be unique")
        return where

    def _call(self, step: CallStep, where: str) -> None:
        self.targets[step.name] = _target(step.endpoint, step.model, step.version, self._env, where)
        self._known.add(step.name)

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
    try:
        raw = yaml.safe_load(path.read_text())
        parsed = PipelineFile.model_validate(raw or {})
    except (OSError, yaml.YAMLError) as exc:
        raise DefinitionError(f"{path}: {exc}") from exc
    except ValidationError as exc:
        raise DefinitionError(f"{path}: {_explain(exc)}") from exc
    plans = {}
    for name, pipeline in parsed.pipelines.items():
        try:
            plans[name] = Plan(name, pipeline, env)
        except DefinitionError as exc:
            raise DefinitionError(f"{path}: {exc}") from exc
    return plans
