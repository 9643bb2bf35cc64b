"""A line's words and their boxes, from the recogniser's time steps: each character of the
decoded text knows the steps it was read at (preprocess/ocr_text.py), a step is a fixed
number of the recogniser's input pixels, and each line carries the matrix from those pixels
to the original image's (`to_image`, preprocess/ocr.py and ocr_lines.py), so a word's steps
become a quadrilateral on the image, through the crop's perspective and turns."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

STEP_PX = 8
"""The recogniser's output has a step per 8 px of its input (48 px high): PP-OCR's
recognisers downsample the width eightfold."""

HEIGHT_PX = 48
"""The recogniser's input height: a word box spans its line's height."""

Span = tuple[int, int]
"""A character's first and last time step; (-1, -1) for a space put in a word gap."""


@dataclass(frozen=True)
class Word:
    text: str
    first: int
    last: int


def split_words(text: str, spans: list[Span]) -> list[Word]:
    """The text's words (runs of non-spaces) with the steps they were read at."""
    words: list[Word] = []
    start = None
    for i, ch in enumerate([*text, " "]):
        if ch != " " and start is None:
            start = i
        elif ch == " " and start is not None:
            words.append(Word(text[start:i], spans[start][0], spans[i - 1][1]))
            start = None
    return words


def word_boxes(
    words: list[Word], to_image: np.ndarray, line_box: np.ndarray | None, margin_steps: float
) -> np.ndarray:
    """FP32 [W,4,2]: each word's box on the image, clockwise from its top-left as read.

    Across the line, a word runs from its first step to the end of its last, widened by
    `margin_steps` on each side (CTC fires inside a character, not at its edge) but never
    past the middle of the gap to its neighbour, nor past the line's box; down, it spans the
    line.
    """
    if not words:
        return np.zeros((0, 4, 2), np.float32)
    margin = margin_steps * STEP_PX
    cores = np.array([[w.first * STEP_PX, (w.last + 1) * STEP_PX] for w in words], np.float64)
    left, right = cores[:, 0] - margin, cores[:, 1] + margin
    if len(words) > 1:
        middles = (cores[1:, 0] + cores[:-1, 1]) / 2
        right[:-1] = np.minimum(right[:-1], middles)
        left[1:] = np.maximum(left[1:], middles)
    end = _line_end(to_image, line_box) if line_box is not None else np.inf
    left, right = np.clip(left, 0, end), np.clip(right, 0, end)
    across = np.stack([left, right, right, left], 1)
    down = np.broadcast_to([0.0, 0.0, HEIGHT_PX, HEIGHT_PX], across.shape)
    boxes = _apply(to_image, np.stack([across, down], -1))
    if line_box is not None:
        boxes = np.clip(boxes, line_box.min(0), line_box.max(0))
    return boxes.astype(np.float32)


def _apply(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Points [..., 2] through a 3x3 perspective matrix."""
    flat = points.reshape(1, -1, 2).astype(np.float64)
    return cv2.perspectiveTransform(flat, matrix.astype(np.float64)).reshape(points.shape)


def _line_end(to_image: np.ndarray, line_box: np.ndarray) -> float:
    """How far the line's crop runs in the recogniser's pixels: its box taken back there."""
    try:
        back = np.linalg.inv(to_image.astype(np.float64))
    except np.linalg.LinAlgError:
        return np.inf
    return float(_apply(back, line_box)[:, 0].max())
