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
    first: int = 0
    """The batch row of `images[0]`: a recipe may run a few rows at a time, and errors
    name the row of the whole request."""

    def tensor(self, name: str) -> np.ndarray:
        try:
            return self.tensors[name]
        except KeyError:
            raise InvalidInput(f"missing input '{name}'") from None
