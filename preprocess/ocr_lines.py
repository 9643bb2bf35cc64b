"""PP-OCR per-line operations: the direction classifier's input and its verdict, the
recogniser's input (conventions and departures: preprocess/ocr.py; the recogniser's output
decoded to text: preprocess/ocr_text.py)."""

from __future__ import annotations

import math

import cv2
import numpy as np

from preprocess.images import convert
from preprocess.ops import op
from preprocess.state import State
from protos.errors import InvalidInput

# ---------------------------------------------------------------- classifier / recogniser


def ceil_width(h: int, w: int, target_h: int, max_w: int) -> int:
    """PaddleOCR's width rule: keep aspect at target_h, rounded up, at most max_w."""
    return min(max_w, math.ceil(target_h * w / float(h)))


PAD = 128
"""Fills the right of shorter crops in a batch: mid-grey, what PaddleOCR's zero after
normalisation (pixel 127.5) comes closest to in a byte."""


def _paddle_batch(images: list[np.ndarray], height: int, width: int) -> np.ndarray:
    """Crops as one UINT8 [N, height, width, 3] batch: each resized to `height` keeping its
    aspect (at most `width` wide), padded on the right with mid-grey. The models normalise
    (pixel / 127.5 - 1) inside their graphs."""
    batch = np.full((len(images), height, width, 3), PAD, np.uint8)
    for i, im in enumerate(images):
        resized_w = ceil_width(im.shape[0], im.shape[1], height, width)
        batch[i, :, :resized_w] = cv2.resize(convert(im, "bgr"), (resized_w, height))
    return batch


def cls_windows(h: int, w: int, aspect: float = 4.0, most: int = 4) -> list[tuple[int, int]]:
    """Column ranges of a crop that the direction classifier looks at.

    The classifier's input is `aspect` times as wide as high; a longer line squeezed into
    it reads as noise (measured: long lines turned upside down). So a long line is seen
    through up to `most` windows of that aspect, spread evenly along it.
    """
    window = max(1, round(aspect * h))
    if w <= 1.5 * window:
        return [(0, w)]
    count = min(most, math.ceil(w / window))
    starts = np.linspace(0, w - window, count).round().astype(int)
    return [(int(x), int(x) + window) for x in starts]


@op
def ocr_cls_batch(state: State, output: str = "x", height: int = 48, width: int = 192) -> None:
    """Crops as the direction classifier's UINT8 [M,48,192,3] input: the windows of every
    crop (`cls_windows`), in crop order."""
    windows = [
        im[:, x0:x1]
        for im in state.images
        for x0, x1 in cls_windows(im.shape[0], im.shape[1], width / height)
    ]
    shape = (len(windows), height, width, 3)
    state.check_batch("the direction classifier's input", shape, np.uint8)
    state.tensors[output] = _paddle_batch(windows, height, width)


@op
def rotate_by_class(
    state: State,
    probs: str = "probs",
    index: int = 1,
    threshold: float = 0.9,
    boxes: str | None = None,
    to_image: str | None = None,
    height: int = 48,
    width: int = 192,
) -> None:
    """Turn crops 180 degrees where class `index` (upside down) scores above `threshold`
    for the crop as a whole: the mean log-odds of its windows (`cls_windows` with the
    classifier's `height` and `width`: one row of `probs` per window). Measured on 2,362
    lines of the generated suite against the mean of probabilities (3 wrong), the median
    (0 wrong, narrow margin) and summed log-odds (2 wrong: overconfident when windows
    disagree): 0 wrong, upright lines scoring at most 0.76 and upside-down ones at least
    0.98 against the threshold of 0.9.

    With `boxes`: when most crops were upside down the page itself is, so its reading
    order runs backwards; crops and boxes are then reversed to read naturally. With
    `to_image` (each crop's matrix to the image's pixels, from `ocr_crops`): turned and
    reversed with its crop.
    """
    p = state.tensor(probs)
    counts = [len(cls_windows(im.shape[0], im.shape[1], width / height)) for im in state.images]
    if p.ndim != 2 or p.shape[0] != sum(counts) or p.shape[1] <= index:
        raise InvalidInput(
            f"input '{probs}': expected [{sum(counts)}, >{index}] (one row per window of "
            f"{len(state.images)} crops), got {list(p.shape)}"
        )
    q = np.clip(p[:, index].astype(np.float64), 1e-6, 1 - 1e-6)
    starts = np.cumsum([0, *counts[:-1]]).astype(int)
    evidence = np.add.reduceat(np.log(q / (1 - q)), starts) if counts else np.zeros(0)
    per_crop = 1 / (1 + np.exp(-evidence / np.maximum(1, counts)))
    flipped = per_crop > threshold
    given = None if boxes is None else len(state.tensor(boxes))
    if given is not None and given != len(state.images):
        raise InvalidInput(f"input '{boxes}' has {given} boxes for {len(state.images)} crops")
    if to_image is not None:
        frames = _frames(state, to_image).copy()
        for i in np.flatnonzero(flipped):
            h, w = state.images[i].shape[:2]
            # Half a turn: (x, y) came from (w - x, h - y).
            frames[i] = frames[i] @ np.array([[-1, 0, w], [0, -1, h], [0, 0, 1]], np.float32)
        state.tensors[to_image] = frames
    state.images = [
        cv2.rotate(im, cv2.ROTATE_180) if flipped[i] else im for i, im in enumerate(state.images)
    ]
    if boxes is None or flipped.sum() * 2 <= len(flipped):
        return
    state.images = state.images[::-1]
    for name in (boxes, to_image):
        if name is not None:
            state.tensors[name] = state.tensor(name)[::-1].copy()


def _frames(state: State, name: str) -> np.ndarray:
    frames = state.tensor(name)
    if frames.shape != (len(state.images), 3, 3):
        raise InvalidInput(
            f"input '{name}': expected [{len(state.images)},3,3] (a matrix a crop), "
            f"got {list(frames.shape)}"
        )
    return frames


@op
def ocr_rec_batch(
    state: State,
    output: str = "x",
    widths_output: str = "widths",
    height: int = 48,
    min_width: int = 320,
    max_width: int = 8192,
    to_image: str | None = None,
) -> None:
    """Crops as the recogniser's UINT8 [N,48,W,3] input, W fitting the widest crop, and
    each row's own width (INT32 [N], at least `min_width`): the recogniser runs each line
    at its width (its `ragged` config), not the padded batch's. A line wider than
    `max_width` at that height is narrowed to it (the recogniser's largest width: its
    memory grows with the square of the width). With `to_image` (each crop's matrix to the
    image's pixels): made to start from the recogniser's input."""
    ratios = [im.shape[1] / im.shape[0] for im in state.images]
    width = min(max_width, int(height * max([min_width / height, *ratios])))
    state.check_batch("the recogniser's input", (len(state.images), height, width, 3), np.uint8)
    resized = [ceil_width(im.shape[0], im.shape[1], height, width) for im in state.images]
    if to_image is not None:
        frames = _frames(state, to_image).copy()
        for i, (im, w) in enumerate(zip(state.images, resized, strict=True)):
            scale = np.diag([im.shape[1] / w, im.shape[0] / height, 1]).astype(np.float32)
            frames[i] = frames[i] @ scale
        state.tensors[to_image] = frames
    state.tensors[output] = _paddle_batch(state.images, height, width)
    state.tensors[widths_output] = np.array([max(min_width, w) for w in resized], dtype=np.int32)
