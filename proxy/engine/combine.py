"""Combiners of a parallel step's branch outputs."""

from __future__ import annotations

from collections import Counter

import numpy as np

from proxy.engine.definitions import Combine


def combine(spec: Combine, outputs: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Tensors of the step itself, from the successful branches' outputs (in branch order)."""
    if spec.op == "collect" or not outputs:
        return {}
    tensor = spec.tensor
    assert tensor is not None
    values = [out[tensor] for out in outputs.values() if tensor in out]
    if not values:
        return {}
    if spec.op == "vote":
        labels = np.stack([np.asarray(v).reshape(len(v), -1)[:, 0] for v in values])
        winners = [Counter(col.tolist()).most_common(1)[0][0] for col in labels.T]
        return {tensor: np.asarray(winners, dtype=labels.dtype)}
    scores = np.mean(np.stack([np.asarray(v, dtype=np.float64) for v in values]), axis=0)
    index = scores.argmax(axis=-1)
    label = (
        np.array([spec.labels[i].encode() for i in index.reshape(-1)], dtype=object)
        if spec.labels
        else index.astype(np.int64)
    )
    if spec.op == "argmax":
        return {"label": label}
    return {tensor: scores.astype(np.float32), "label": label}
