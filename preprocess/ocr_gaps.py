"""Word gaps seen on the line itself: which columns of the recogniser's input hold ink.

The recogniser answers one step per 8 px of its 48 px high input, and a character takes 2-3
steps: a word gap is often one blank step more than the gap between two letters, too coarse to
tell them apart alone. The image is not: between two letters of a word the ink is a few pixels
apart, between two words a space's width. `ocr_ink` measures, for every line, how many ink
pixels each column of the recogniser's input holds and how tall its text is; the decoding step
(ocr_text.py) finds the widest run of empty columns between two characters and weighs it with
the recogniser's own space probability (docs/accuracy.md has the measurements).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from dataclasses import dataclass

import cv2
import numpy as np

from preprocess.ocr_lines import ceil_width
from preprocess.ops import op
from preprocess.state import State
from protos.errors import InvalidInput

STEP_PX = 8
"""Pixels of the recogniser's input per output step (PP-OCR's recognisers: width / 8)."""


def ink_profile(grey: np.ndarray) -> tuple[np.ndarray, float]:
    """(ink pixels per column, the text's height in pixels) of one line: ink is the minority
    side of Otsu's threshold (dark on light or light on dark alike); the text's height runs
    over the rows holding at least 15% of the busiest row's ink."""
    _, binary = cv2.threshold(grey, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    ink = binary > 0
    if np.count_nonzero(ink) * 2 > ink.size:
        ink = ~ink
    rows = np.count_nonzero(ink, axis=1)
    busy = np.flatnonzero(rows > 0.15 * rows.max()) if rows.max() else np.zeros(0, np.int64)
    height = float(busy[-1] - busy[0] + 1) if len(busy) else float(grey.shape[0])
    return np.count_nonzero(ink, axis=0).astype(np.uint8), height


@op
def ocr_ink(
    state: State,
    input: str = "x",
    output: str = "ink",
    height_output: str = "ink_height",
) -> None:
    """From the recogniser's batch (`input`, UINT8 [N,H,W,3], made by ocr_rec_batch from
    `state.images`): UINT8 [N,W] ink pixels per column (0 past a line's own width) and FP32
    [N] its text's height in pixels."""
    batch = state.tensor(input)
    if batch.ndim != 4 or len(batch) != len(state.images):
        raise InvalidInput(f"'{input}' {list(batch.shape)} is not one row per line image")
    height, width = batch.shape[1], batch.shape[2]
    columns = np.zeros((len(batch), width), np.uint8)
    heights = np.full(len(batch), float(height), np.float32)
    for i, image in enumerate(state.images):
        own = ceil_width(image.shape[0], image.shape[1], height, width)
        grey = cv2.cvtColor(np.ascontiguousarray(batch[i, :, :own]), cv2.COLOR_BGR2GRAY)
        columns[i, :own], heights[i] = ink_profile(grey)
    state.tensors[output] = columns
    state.tensors[height_output] = heights


@dataclass(frozen=True)
class GapWeights:
    """A space between two characters when `bias` plus the weighted features is above 0 (a
    logistic model fitted on the generated suite, docs/accuracy.md)."""

    bias: float = 0.0
    log_space: float = 0.0
    """log10 of the recogniser's highest space probability between the two characters."""
    blank_steps: float = 0.0
    """Blank steps between them."""
    pitch: float = 0.0
    """Their distance in steps over the line's median distance between characters."""
    after_punctuation: float = 0.0
    """1 after , : ; ! ? before a letter (ocr_text.py's rule for Latin punctuation)."""
    before_hyphen: float = 0.0
    """1 when the second is a hyphen (a code's `KT-48`)."""
    after_period: float = 0.0
    """1 when the first is a full stop."""
    ink_gap: float = 0.0
    """The widest run of empty columns between the two characters' centres, less the line's
    median of those runs, over the text's height."""

    @staticmethod
    def features(
        likely: float,
        blanks: int,
        pitch: float,
        after_punctuation: bool,
        before: str,
        after: str,
        ink_gap: float,
    ) -> tuple[float, ...]:
        """A gap between `before` and `after`, as the weights after `bias` read it (the
        fields' order; models/word_gaps.py fits them on these)."""
        return (
            math.log10(max(likely, 1e-6)),
            float(blanks),
            pitch,
            float(after_punctuation),
            float(after == "-"),
            float(before == "."),
            ink_gap,
        )

    @functools.cached_property
    def vector(self) -> tuple[float, ...]:
        """The weights after `bias`, in the order of `features`."""
        return (
            self.log_space,
            self.blank_steps,
            self.pitch,
            self.after_punctuation,
            self.before_hyphen,
            self.after_period,
            self.ink_gap,
        )

    def says_space(self, gap: tuple[float, ...]) -> bool:
        """Whether a gap (its `features`) is a word gap."""
        return self.bias + sum(map(operator.mul, self.vector, gap)) > 0


def empty_runs(columns: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """The widest run of empty columns between each pair of neighbouring centres (px)."""
    empty = np.concatenate(([0], (columns == 0).astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(empty))
    starts, ends = edges[::2], edges[1::2]  # runs of empty columns: [start, end)
    if len(centres) < 2 or not len(starts):
        return np.zeros(max(0, len(centres) - 1), np.float64)
    # Each run clipped to each pair's span (runs x pairs): the widest that is left.
    lo = np.maximum(starts[:, None], centres[None, :-1])
    hi = np.minimum(ends[:, None], centres[None, 1:])
    return np.maximum(hi - lo, 0).max(axis=0).astype(np.float64)


@dataclass(frozen=True)
class Ink:
    """One line's ink (ocr_ink's outputs) and the weights its gaps are judged by."""

    columns: np.ndarray
    """Ink pixels per column of the recogniser's input."""
    height: float
    """The text's height in pixels."""
    weights: GapWeights

    def gaps(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """GapWeights.ink_gap between each pair of neighbouring characters (their first and
        last steps)."""
        centres = (starts + ends + 1) * (STEP_PX // 2)
        runs = empty_runs(self.columns, centres)
        if not len(runs):
            return runs
        return (runs - float(np.median(runs))) / max(self.height, 1.0)


def check_weights(weights: object) -> None:
    """The recipe's `ink_gap_weights` (None: not weighed), checked when the recipes load: a
    misspelt weight would otherwise fail every line at the first request."""
    if weights is None:
        return
    if not isinstance(weights, dict):
        raise ValueError("ink_gap_weights must map GapWeights' fields to numbers")
    for key, value in weights.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"ink_gap_weights: {key} must be a number, not {value!r}")
    try:
        GapWeights(**weights)
    except TypeError as exc:
        known = ", ".join(f.name for f in dataclasses.fields(GapWeights))
        raise ValueError(f"ink_gap_weights: {exc} (known: {known})") from None
