from __future__ import annotations

import numpy as np
import pytest

from proxy.engine.combine import combine
from proxy.engine.definitions import Combine

BRANCHES = {
    "a": {"p": np.array([[0.7, 0.2, 0.1]], np.float32), "label": np.array([0])},
    "b": {"p": np.array([[0.1, 0.5, 0.4]], np.float32), "label": np.array([1])},
    "c": {"p": np.array([[0.1, 0.6, 0.3]], np.float32), "label": np.array([1])},
}
MEAN = Combine(op="mean", tensor="p")


def test_mean_averages_scores_and_labels_the_best() -> None:
    out, unfit = combine(MEAN, BRANCHES)
    np.testing.assert_allclose(out["p"], [[0.3, 1.3 / 3, 0.8 / 3]], rtol=1e-6)
    assert out["label"].tolist() == [1] and unfit == {}


def test_argmax_with_class_names() -> None:
    out, _ = combine(Combine(op="argmax", tensor="p", labels=["cat", "dog", "emu"]), BRANCHES)
    assert out == {"label": out["label"]} and out["label"].tolist() == [b"dog"]


def test_vote_takes_the_majority_label() -> None:
    assert combine(Combine(op="vote", tensor="label"), BRANCHES)[0]["label"].tolist() == [1]


def test_collect_and_nothing_to_combine() -> None:
    assert combine(Combine(), BRANCHES) == ({}, {})
    assert combine(MEAN, {}) == ({}, {})


def _with_c(p) -> dict:
    return {**BRANCHES, "c": {"p": p, "label": np.array([1])}}


@pytest.mark.parametrize(
    ("p", "why"),
    [
        (np.array([[0.1, 0.6]], np.float32), "has shape [1, 2], unlike [1, 3] as the others'"),
        (np.full((4, 3), 0.3, np.float32), "has shape [4, 3], unlike [1, 3] as the others'"),
        (np.array([[np.nan, 0.6, 0.3]], np.float32), "not finite"),
        (np.array([[np.inf, 0.6, 0.3]], np.float64), "not finite"),
        (np.array([[b"x", b"y", b"z"]], dtype=object), "is not numbers (object)"),
    ],
    ids=["narrow", "rows", "nan", "inf", "bytes"],
)
def test_a_branch_answer_that_cannot_be_combined_is_left_out_and_named(p, why: str) -> None:
    out, unfit = combine(MEAN, _with_c(p))
    assert list(unfit) == ["c"] and why in unfit["c"]
    np.testing.assert_allclose(out["p"], [[0.4, 0.35, 0.25]], rtol=1e-6)  # a and b only
    assert out["label"].tolist() == [0]


def test_branches_tied_on_two_shapes_are_all_misfits() -> None:
    two = {"a": BRANCHES["a"], "b": {"p": np.array([[0.1, 0.9]], np.float32)}}
    out, unfit = combine(MEAN, two)
    assert out == {} and set(unfit) == {"a", "b"}
    assert "unlike another branch's" in unfit["a"]


def test_a_missing_tensor_is_named() -> None:
    out, unfit = combine(MEAN, {**BRANCHES, "c": {"label": np.array([1])}})
    assert unfit == {"c": "its answer has no 'p'"} and out["label"].tolist() == [0]


def _numpy_mean(taken: list[np.ndarray], labels: list[str] | None) -> tuple[np.ndarray, np.ndarray]:
    """The mean and label as numpy computes them (combine's path for large scores)."""
    scores = np.mean(np.stack([np.asarray(v, dtype=np.float64) for v in taken]), axis=0)
    index = scores.argmax(axis=-1)
    if labels:
        return scores.astype(np.float32), np.array(
            [labels[i].encode() for i in index.reshape(-1)], dtype=object
        )
    return scores.astype(np.float32), index.astype(np.int64)


@pytest.mark.parametrize("shape", [(10,), (1, 10), (3, 7), (2, 1), (1, 1500)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_scores_are_averaged_to_the_bit_as_numpy_averages_them(shape, dtype) -> None:
    """Small scores are averaged as Python floats (fewer numpy calls on cold caches): the
    same bits, shape and dtype as numpy's mean, ties going to the first maximum, whatever
    the branches' count; large ones take numpy's path."""
    rng = np.random.default_rng(7)
    for trial in range(200):
        n = 1 + trial % 5
        taken = [rng.random(shape).astype(dtype) for _ in range(n)]
        if trial % 3 == 0:  # ties: every branch gives some classes the same score
            for v in taken:
                v[..., : shape[-1] // 2 + 1] = v.reshape(-1)[0]
        labels = [f"c{i}" for i in range(shape[-1])] if trial % 2 else None
        spec = Combine(op="mean", tensor="p", labels=labels)
        out, unfit = combine(spec, {f"b{i}": {"p": v} for i, v in enumerate(taken)})
        scores, label = _numpy_mean(taken, labels)
        assert unfit == {}
        assert out["p"].dtype == np.float32 and out["p"].shape == scores.shape
        assert out["p"].tobytes() == scores.tobytes()
        assert out["label"].dtype == label.dtype and out["label"].shape == label.shape
        assert out["label"].tolist() == label.tolist()
