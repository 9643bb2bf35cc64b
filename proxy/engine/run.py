"""The state of one request through a pipeline (`Run`), and each step's record in it
(`StepStatus`): what the executor fills, the doors answer from, the cache keeps and the
console shows."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from protos.codec import content_bytes
from proxy.engine.cache.entries import Stored
from proxy.engine.ledger import Ledger
from proxy.engine.plan import Plan
from proxy.errors import StepError


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
    variant: str | None = None
    """A step with a canary (<VARIABLE>_CANARY): `live` or `canary`, the model that answered."""


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
    rendered: object = None
    """Its `result`, once rendered (Engine.result): the prediction log reads the door's."""

    def entry(self) -> Stored | None:
        """What the inference cache keeps of a finished run: a complete answer's tensors,
        none that a canary gave (kept, it would answer every later sighting of the input,
        far past its share, until it expired)."""
        if self.partial or (self.plan.canaries and any(s.variant == "canary" for s in self.steps)):
            return None
        return Stored(dict(self.tensors), dict(self.branches))

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


@dataclass(slots=True)
class Ended:
    """A request as it ended, whatever became of it: what the console's record and the
    prediction log take of it (Engine.ticket)."""

    pipeline: str
    request_id: str
    status: str
    """The HTTP status it ended with (499: the client left)."""
    opened: float
    """perf_counter when the proxy took it."""
    steps: list[StepStatus]
    run: Run | None = None
    """Its run, once it had one that answered."""
    inputs: dict[str, np.ndarray] | None = None
    """Its tensors, once read."""
    plan: Plan | None = None
    """Its pipeline's plan: which model each step called."""
