"""Combiners of a parallel step's branch outputs, and the branch answers they cannot take.

A predictor swapped by a variable may be anyone's server: its answer is checked, not
trusted. Measured before: a branch answering 9 scores where the others answer 10 (or four
rows for one) made every request a 500, `digits-partial`'s too; one answering NaN made the
mean's label 0 for every request, silently."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from proxy.engine.definitions import Combine

Outputs = dict[str, dict[str, np.ndarray]]


def combine(spec: Combine, outputs: Outputs) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Tensors of the step itself, from the successful branches' outputs (in branch order),
    and the branches whose answer could not be taken, with why (see `misfits`)."""
    tensor = spec.tensor
    if spec.op == "collect" or tensor is None or not outputs:
        return {}, {}
    unfit = misfits(tensor, spec.op != "vote", outputs)
    taken = [out[tensor] for name, out in outputs.items() if name not in unfit]
    if not taken:
        return {}, unfit
    if spec.op == "vote":
        labels = np.stack([np.asarray(v).reshape(len(v), -1)[:, 0] for v in taken])
        winners = [Counter(col.tolist()).most_common(1)[0][0] for col in labels.T]
        return {tensor: np.asarray(winners, dtype=labels.dtype)}, unfit
    small = _small_mean(taken, spec)
    if small is not None:
        return small, unfit
    scores = np.mean(np.stack([np.asarray(v, dtype=np.float64) for v in taken]), axis=0)
    if not np.isfinite(scores).all():  # checked once here, each branch only when it fails
        for name, out in outputs.items():
            if name not in unfit and not np.isfinite(np.asarray(out[tensor], np.float64)).all():
                unfit[name] = f"its '{tensor}' has values that are not finite (NaN or infinity)"
        taken = [
            np.asarray(out[tensor], np.float64) for n, out in outputs.items() if n not in unfit
        ]
        if not taken:
            return {}, unfit
        scores = np.mean(np.stack(taken), axis=0)
    index = scores.argmax(axis=-1)
    label = (
        np.array([spec.labels[i].encode() for i in index.reshape(-1)], dtype=object)
        if spec.labels
        else index.astype(np.int64)
    )
    if spec.op == "argmax":
        return {"label": label}, unfit
    return {tensor: scores.astype(np.float32), "label": label}, unfit


SMALL = 1024
"""Scores of at most this many elements a branch are averaged as Python floats."""


def _small_mean(taken: list[np.ndarray], spec: Combine) -> dict[str, np.ndarray] | None:
    """`combine`'s mean (and best index) of a few finite float scores of one or two
    dimensions, computed as Python floats, to the bit what numpy computes (float64 sums
    left to right, divided by the count; the first of equal maxima); None for anything else,
    which numpy does. At c=1 each numpy call runs on caches the other processes emptied:
    the mean of three [1, 10] scores took ~130 us in the proxy against ~15 us in a loop
    (bench/README, 2026-12-03)."""
    first = taken[0]
    if first.ndim not in (1, 2) or first.size > SMALL or first.shape[-1] == 0:
        return None
    if any(v.dtype.kind != "f" for v in taken):
        return None
    count = len(taken)
    tables = [v.tolist() if v.ndim == 2 else [v.tolist()] for v in taken]
    means: list[list[float]] = []
    best: list[int] = []
    for rows in zip(*tables, strict=True):
        row = []
        for values in zip(*rows, strict=True):
            total = values[0]
            for value in values[1:]:
                total += value
            row.append(total / count)
        if not all(map(math.isfinite, row)):
            return None  # numpy's path names the branches that are not finite
        means.append(row)
        best.append(max(range(len(row)), key=row.__getitem__))
    if spec.labels:
        label = np.array([spec.labels[i].encode() for i in best], dtype=object)
    else:
        label = np.array(best if first.ndim == 2 else best[0], dtype=np.int64)
    if spec.op == "argmax":
        return {"label": label}
    scores = np.array(means if first.ndim == 2 else means[0], dtype=np.float32)
    return {spec.tensor: scores, "label": label}  # type: ignore[dict-item]


def misfits(tensor: str, numbers: bool, outputs: Outputs) -> dict[str, str]:
    """Branches whose `tensor` is missing, not numbers (when `numbers`), or of a shape
    unlike the other branches'. Shapes go by majority; branches tied with another shape are
    all misfits, since which is right cannot be told."""
    bad: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, out in outputs.items():
        value = out.get(tensor)
        if value is None:
            bad[name] = f"its answer has no '{tensor}'"
        elif numbers and value.dtype.kind not in "biuf":
            bad[name] = f"its '{tensor}' is not numbers ({value.dtype})"
        else:
            shapes[name] = value.shape
    if len(set(shapes.values())) > 1:
        counts = Counter(shapes.values()).most_common()
        common, most = counts[0]
        tied = counts[1][1] == most
        for name, shape in shapes.items():
            if tied or shape != common:
                like = "another branch's" if tied else f"{list(common)} as the others'"
                bad[name] = f"its '{tensor}' has shape {list(shape)}, unlike {like}"
    return bad
