"""Pipeline definitions (YAML): declarative steps, checked once at start-up.

A reference names a tensor: `request.<input>` for the uploaded body, or
`<step>.<tensor>` for an output of an earlier step (tensor names may contain
dots; step names may not). Referring only to earlier steps rules out cycles.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from protos.strict import Strict
from proxy.engine.tensors import InputTensor, OutputTensor
from proxy.errors import DefinitionError

_NAME = r"^[A-Za-z0-9_\-]+$"


class Step(Strict):
    """What every kind of step has. A new kind is a subclass, an `Entry` (its YAML key), and
    a case in the two places that `match` on the kinds: Plan._walk (engine/plan.py) and
    Executor._steps (engine/executor.py)."""

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
    endpoint: str
    """Environment variable holding host:port[/model[/version]]."""
    model: str | None = None
    version: str = ""
    cache: bool = False
    """The data cache: the step's outputs kept, keyed by the model (its address, name,
    version and fingerprint) and the input tensors' bytes, so a repeated input skips the
    call (e.g. the preprocessing that several pipelines share)."""


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
    branches: list[Branch] = []
    branches_from: BranchesFrom | None = None
    aggregation: Literal["all_or_nothing", "partial"] = "all_or_nothing"
    combine: Combine = Combine()


class Condition(Strict):
    empty: bool | None = None
    """True: the tensor has no rows."""
    equals: Any = None
    one_of: list[Any] | None = None

    def holds(self, value: np.ndarray) -> bool:
        """Whether `value` (a switch step's input tensor) meets every test given."""
        if self.empty is not None and (value.shape[0] == 0 if value.ndim else False) != self.empty:
            return False
        if self.equals is not None or self.one_of is not None:
            if value.size == 0:
                return False
            first = value.reshape(-1)[0]
            if isinstance(first, bytes):
                first = first.decode()
            elif isinstance(first, np.generic):
                first = first.item()
            if self.equals is not None and first != self.equals:
                return False
            if self.one_of is not None and first not in self.one_of:
                return False
        return True


class Case(Strict):
    when: Condition
    steps: list[Entry] = []


class SwitchStep(Step):
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


class CacheConfig(Strict):
    """The inference cache of a pipeline: whole answers, keyed by the pipeline, the models it
    calls and the request's tensors (proxy/engine/cache/keys.py). Partial answers and
    errors are never kept."""

    enabled: bool = True
    ttl_s: float = Field(default=300.0, gt=0)
    """How long an answer is kept."""
    max_mb: float = Field(default=64.0, gt=0)
    """The pipeline's share of the in-process cache (least recently used answers go first);
    with Redis, its own `maxmemory` bounds every entry."""
    admit: Literal["first", "second"] = "first"
    """When a computed answer is kept: `first`, every time; `second`, only when its key was
    seen lately (a doorkeeper of a few bits a key, where the entries are: in each proxy
    process, or in the shared Redis), for the pipeline's answers and the outputs its steps
    cache. `second` spares the cost of keeping answers nobody asks for again (with no
    repeats, 1.11-1.29x the proxy's CPU a cheap request of no cache, against ~1.05x), at
    the price of computing the first repeat (a client's retry) once more."""


class Pipeline(Strict):
    description: str = ""
    input: str = Field(default="image", pattern=_NAME)
    """Name of the request tensor (BYTES [1]) holding the uploaded body."""
    inputs: dict[str, InputTensor] | None = None
    """Tensors the pipeline takes instead of one uploaded file (`input`): several named
    inputs of any datatype and shape. /v1 takes them as a JSON object (name -> the tensor as
    nested lists, BYTES elements as strings) or as multipart fields (a file or text per
    BYTES input); the v2 doors as v2 tensors. `request.<name>` refers to one."""
    accept: list[Literal["png", "jpeg", "bmp", "webp", "tiff"]] | None = None
    """Image formats the upload may be, told by its first bytes (protos/media.py); any
    other upload gets 415. Unset: the body is passed on whatever it is."""
    timeout_ms: float = Field(default=5000, gt=0)
    """Budget of a request unless X-Request-Timeout-Ms asks for less (or more, up to the cap)."""
    max_in_flight: int | None = Field(default=None, ge=1)
    """Requests of this pipeline served at once; more wait for room (`max_queued`)."""
    max_inflight_mpx: float | None = Field(default=None, gt=0)
    """Megapixels of uploaded images (as their models decode them) worked on at once; more
    wait for room. A page photo costs what a hundred text lines do: a count of requests
    alone cannot keep a crowd of large pages within the budget."""
    max_queued: int | None = Field(default=None, ge=0)
    """Requests waiting for room at once, first come first served (engine/room.py); more
    get 503 + Retry-After. Unset: those the pipeline's pace says would still be answered
    within their budgets (the rest are told so, 503); 0: none waits."""
    steps: list[Entry] = Field(min_length=1)
    result: dict[str, Any]
    """The /v1 answer's `result`, shaped from the tensors (results.py)."""
    outputs: dict[str, OutputTensor] | None = None
    """The pipeline's outputs as a v2 model. Unset: one BYTES output `result` holding the
    /v1 `result` as JSON."""
    cache: CacheConfig | None = None
    """The inference cache (`cache: true`, or its settings); unset or false: none."""
    later: str | None = Field(default=None, pattern=_NAME)
    """Sync-async: another pipeline taking the same request, whose answer comes later. /infer
    answers this pipeline's result now, with `later` naming a job (POST .../jobs) that runs
    the other one on the same input."""

    @field_validator("cache", mode="before")
    @classmethod
    def _cache_shorthand(cls, value: Any) -> Any:
        if value is True:
            return {}
        if value is False:
            return None
        return value

    @model_validator(mode="after")
    def _one_kind_of_request(self) -> Pipeline:
        if self.inputs is not None:
            if self.accept is not None:
                raise ValueError("`accept` is for a pipeline taking an upload, not `inputs`")
            if not self.inputs:
                raise ValueError("`inputs` names no tensor")
            bad = [n for n in self.inputs if not re.match(_NAME, n)]
            if bad:
                raise ValueError(f"input names must match {_NAME}: {bad}")
        return self

    def input_names(self) -> list[str]:
        """The request's tensors: the declared `inputs`, or the one upload."""
        return list(self.inputs) if self.inputs is not None else [self.input]


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


def parse(path: Path) -> PipelineFile:
    """The pipeline file, checked against the schema (DefinitionError naming each problem)."""
    try:
        raw = yaml.safe_load(path.read_text())
        return PipelineFile.model_validate(raw or {})
    except (OSError, yaml.YAMLError) as exc:
        raise DefinitionError(f"{path}: {exc}") from exc
    except ValidationError as exc:
        raise DefinitionError(f"{path}: {_explain(exc)}") from exc
