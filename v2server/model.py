"""The transport-free interface between the server core and what it serves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from v2server.statistics import ModelStatistics


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model, as ModelMetadata reports it."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    """Full shape; -1 marks a variable-size dimension (including the batch one)."""
    optional: bool = False


@dataclass(frozen=True)
class Scheduling:
    """How a model's requests are run, as Triton's ModelConfig reports it."""

    max_batch_size: int = 0
    """Largest first dimension a request may have; 0: inputs are full shapes, never merged."""
    max_queue_delay_s: float | None = None
    """Dynamic batching's wait for company; None: requests are never merged."""
    instances: int = 1
    """Executions that may run at once."""


class ServedModel(Protocol):
    """One loaded version of one model."""

    name: str
    version: str
    platform: str
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    labels: list[str] | None
    """Class names for the classification extension, if the model has them."""
    scheduling: Scheduling
    statistics: ModelStatistics
    """Updated by the model's batcher (executions, queueing) and the servicer (requests)."""

    @property
    def ready(self) -> bool: ...

    async def infer(
        self, inputs: dict[str, np.ndarray], deadline: float | None
    ) -> dict[str, np.ndarray]:
        """Run the model. `deadline` is absolute, in the running loop's time()."""
        ...


class ModelRepository(Protocol):
    """Everything a server hosts, resolved by name and optional version."""

    def resolve(self, name: str, version: str = "") -> ServedModel:
        """The model version to use; raises protos.errors.NotFound."""
        ...

    def versions(self, name: str) -> list[str]:
        """Loaded versions of a model, oldest first; raises NotFound."""
        ...

    def names(self) -> list[str]: ...

    @property
    def ready(self) -> bool: ...

    async def start(self) -> None:
        """Load and warm up everything; the server reports ready only after this."""
        ...

    async def stop(self) -> None: ...
