"""A predictor's digest (what the proxy's cache keys read from its configuration) covers
the runtime that computes its answers, not only its files."""

from __future__ import annotations

from pathlib import Path

import onnxruntime
import pytest

from predictors import repository


def test_the_runtime_is_part_of_a_models_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An onnxruntime upgrade keeps a model's files and version, but its kernels may round
    differently: a shared cache must not answer the upgraded predictor's requests with the
    old one's entries."""
    graph = tmp_path / "model.onnx"
    graph.write_bytes(b"a graph")
    labels = {"labels.txt": ["zero", "one"]}
    assert f"onnxruntime {onnxruntime.__version__}" in repository.RUNTIME
    digest = repository._digest([graph], labels)
    assert repository._digest([graph], labels) == digest  # the same on every replica
    monkeypatch.setattr(repository, "RUNTIME", repository.RUNTIME.replace(".", "!", 1))
    assert repository._digest([graph], labels) != digest
    monkeypatch.undo()
    graph.write_bytes(b"another graph")
    assert repository._digest([graph], labels) != digest
