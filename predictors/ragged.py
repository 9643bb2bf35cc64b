"""Rows of a padded batch run one at a time, each cut to its own length (config `ragged`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from predictors.config import Ragged
from protos.errors import InvalidInput

Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def row_lengths(model: str, ragged: Ragged, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """Each row's length, checked against the padded input before anything runs."""
    padded, lengths = inputs[ragged.input], inputs[ragged.lengths]
    if padded.ndim <= ragged.axis:
        raise InvalidInput(
            f"model '{model}': input '{ragged.input}' has {padded.ndim} dimensions, "
            f"its padded axis is {ragged.axis}"
        )
    if lengths.shape != (padded.shape[0],):
        raise InvalidInput(
            f"model '{model}': input '{ragged.lengths}' must hold one length per row of "
            f"'{ragged.input}' ([{padded.shape[0]}]), got {list(lengths.shape)}"
        )
    limit = padded.shape[ragged.axis]
    if lengths.size and (lengths.min() < 1 or lengths.max() > limit):
        raise InvalidInput(
            f"model '{model}': input '{ragged.lengths}' holds lengths outside 1..{limit} "
            f"(the padded size of '{ragged.input}' along axis {ragged.axis})"
        )
    return lengths.astype(np.int64)


def run_rows(
    model: str, ragged: Ragged, inputs: Mapping[str, np.ndarray], run: Run
) -> dict[str, np.ndarray]:
    """`run` on every row alone; the listed outputs padded back to the longest row."""
    lengths = row_lengths(model, ragged, inputs)
    answers = []
    for i, length in enumerate(lengths.tolist()):
        feeds = {name: arr[i : i + 1] for name, arr in inputs.items() if name != ragged.lengths}
        cut = [slice(None)] * feeds[ragged.input].ndim
        cut[ragged.axis] = slice(0, length)
        feeds[ragged.input] = feeds[ragged.input][tuple(cut)]
        answers.append(run(feeds))
    return {name: _stack(name, [a[name] for a in answers], ragged) for name in answers[0]}


def _stack(name: str, rows: list[np.ndarray], ragged: Ragged) -> np.ndarray:
    axis = ragged.outputs.get(name)
    if axis is not None:
        longest = max(r.shape[axis] for r in rows)
        padded = []
        for r in rows:
            widths = [(0, 0)] * r.ndim
            widths[axis] = (0, longest - r.shape[axis])
            padded.append(np.pad(r, widths))
        rows = padded
    return np.concatenate(rows, axis=0)
