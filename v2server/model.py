"""The transport-free interface between the server core and what it serves.

A service provides `Runnable`s (a synchronous `run` and its scheduling settings); the core
wraps each in a `ServedModel` (v2server/served.py: batcher, statistics, warm-up) and keeps
them in one `Registry`. The data plane talks to anything that is `Served`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from v2server.statistics import ModelStatistics


class LoadError(Exception):
    """A model could not be loaded or warmed up (a start-up error, exit status 2)."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model, as ModelMetadata reports it."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    """Full shape; -1 marks a variable-size dimension (including the batch one)."""
    optional: bool = False
    max_shape: tuple[int, ...] = ()
    """An input's largest size along each dimension (-1: no bound); empty: none."""
    multiple_of: tuple[int, ...] = ()
    """What each dimension of an input must be a multiple of (1 or -1: any); empty: none."""
    max_elements: int = 0
    """An input's largest element count (the product of its shape); 0: no bound."""


class Outputs(dict):
    """A model's outputs (name -> tensor) that carry parameters for the response as well
    (a pipeline says whether it answered from its cache), and outputs made only when a
    request names them (`on_demand`, the model's `on_request`: a pipeline's /v1 result as
    JSON): a Served model may return one."""

    def __init__(
        self,
        tensors: dict[str, np.ndarray],
        parameters: dict[str, str | int | bool],
        on_demand: Mapping[str, Callable[[], np.ndarray]] | None = None,
    ):
        super().__init__(tensors)
        self.parameters = parameters
        self.on_demand = on_demand or {}

    def __missing__(self, name: str) -> np.ndarray:
        if name not in self.on_demand:
            raise KeyError(name)
        self[name] = value = self.on_demand[name]()
        return value


@dataclass(frozen=True)
class Scheduling:
    """How a model's requests are run, as Triton's ModelConfig reports it."""

    max_batch_size: int = 0
    """Largest first dimension a request may have; 0: inputs are full shapes, never merged."""
    max_queue_delay_s: float | None = None
    """Dynamic batching's wait for company; None: requests are never merged."""
    preferred_batch_size: int = 0
    """A batch stops waiting for company once it holds this many rows; 0: max_batch_size."""
    instances: int = 1
    """Executions that may run at once."""
    max_queue: int = 256
    """Requests that may wait for an execution; beyond that RESOURCE_EXHAUSTED."""
    inline_below_s: float = 0.0
    """Executions quicker than this (on average) run on the event loop, not in a thread."""
    inline_max_bytes: int = 1 << 16
    """...and only for requests carrying at most this many bytes."""


class Described(Protocol):
    """What ModelMetadata and ModelConfig report of one version of one model."""

    name: str
    version: str
    platform: str
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    labels: Mapping[str, list[str]]
    """Class names for the classification extension, by output: only an output that
    declares them has them (Triton's label_filename is per output)."""
    scheduling: Scheduling


class Runnable(Described, Protocol):
    """What a service provides for one version of one model."""

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One synchronous execution (in a worker thread, or inline when quick)."""
        ...

    def warmup_inputs(self) -> dict[str, np.ndarray] | None:
        """Inputs for a run before the model reports ready; None: no warm-up."""
        ...


class Served(Described, Protocol):
    """One loaded version of one model, as the data plane and the registry see it."""

    statistics: ModelStatistics
    """Executions and queueing (recorded by the batcher); requests (by the data plane)."""

    @property
    def ready(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def infer(
        self, inputs: dict[str, np.ndarray], deadline: float | None
    ) -> dict[str, np.ndarray]:
        """Run the model. `deadline` is absolute, in the running loop's time()."""
        ...
