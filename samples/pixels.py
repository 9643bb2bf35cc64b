"""What the input generators share: colours and encoding."""

from __future__ import annotations

import cv2
import numpy as np

Colour = tuple[int, int, int]
_LUMA = np.array([0.114, 0.587, 0.299])  # BGR


def contrasting(rng: np.random.Generator, min_diff: float) -> tuple[Colour, Colour]:
    """Two colours whose grey levels differ by at least min_diff, in random order."""
    while True:
        a, b = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
        if abs(float(a @ _LUMA) - float(b @ _LUMA)) >= min_diff:
            return tuple(int(v) for v in a), tuple(int(v) for v in b)  # type: ignore[return-value]


def encode(img: np.ndarray, jpeg: int | None) -> bytes:
    """PNG, or JPEG of the given quality."""
    ext, params = (".png", []) if jpeg is None else (".jpg", [cv2.IMWRITE_JPEG_QUALITY, jpeg])
    ok, buf = cv2.imencode(ext, img, params)
    assert ok
    return buf.tobytes()
