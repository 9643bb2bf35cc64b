from __future__ import annotations

import numpy as np

from proxy.engine.combine import combine
from proxy.engine.definitions import Combine

BRANCHES = {
    "a": {"p": np.array([[0.7, 0.2, 0.1]], np.float32), "label": np.array([0])},
    "b": {"p": np.array([[0.1, 0.5, 0.4]], np.float32), "label": np.array([1])},
    "c": {"p": np.array([[0.1, 0.6, 0.3]], np.float32), "label": np.array([1])},
}


def test_mean_averages_scores_and_labels_the_best() -> None:
    out = combine(Combine(op="mean", tensor="p"), BRANCHES)
    np.testing.assert_allclose(out["p"], [[0.3, 1.3 / 3, 0.8 / 3]], rtol=1e-6)
    assert out["label"].tolist() == [1]


def test_argmax_with_class_names() -> None:
    out = combine(Combine(op="argmax", tensor="p", labels=["cat", "dog", "emu"]), BRANCHES)
    assert out == {"label": out["label"]} and out["label"].tolist() == [b"dog"]


def test_vote_takes_the_majority_label() -> None:
    assert combine(Combine(op="vote", tensor="label"), BRANCHES)["label"].tolist() == [1]


def test_collect_and_nothing_to_combine() -> None:
    assert combine(Combine(), BRANCHES) == {}
    assert combine(Combine(op="mean", tensor="p"), {}) == {}
