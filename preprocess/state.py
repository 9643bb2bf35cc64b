"""What a recipe's operations read and write while it runs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from preprocess.images import ImageLimits
from protos.errors import InvalidInput


@dataclass
class State:
    tensors: dict[str, np.ndarray]
    """The request's inputs, and the outputs operations add."""
    limits: ImageLimits
    images: list[np.ndarray] = field(default_factory=list)
    """The images being transformed, one per batch row."""

    def tensor(self, name: str) -> np.ndarray:
        try:
            return self.tensors[name]
        except KeyError:
            raise InvalidInput(f"missing input '{name}'") from None
