"""What a recipe's operations read and write while it runs."""

from __future__ import annotations

import math
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
    sizes: list[tuple[int, int]] = field(default_factory=list)
    """Each decoded image's (height, width) as sent and shown (its EXIF orientation
    applied), which a JPEG decoded smaller (`decode`'s `min_pixels`) is not: what answers
    in the image's pixels (OCR's boxes) map back to. Empty where images came otherwise."""
    first: int = 0
    """The batch row of `images[0]`: a recipe may run a few rows at a time, and errors
    name the row of the whole request."""

    def tensor(self, name: str) -> np.ndarray:
        try:
            return self.tensors[name]
        except KeyError:
            raise InvalidInput(f"missing input '{name}'") from None

    def check_batch(self, what: str, shape: tuple[int, ...], dtype: np.dtype | type) -> None:
        """Raise InvalidInput when a batch of `shape` would pass `limits.max_batch_bytes`,
        before it is allocated."""
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if size > self.limits.max_batch_bytes:
            raise InvalidInput(
                f"{what} would be {list(shape)} {np.dtype(dtype)} = {size} bytes, more than "
                f"the limit of {self.limits.max_batch_bytes}"
            )
