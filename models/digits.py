"""Digits classifiers: trained on scikit-learn's bundled digits data, exported with skl2onnx.

Every classifier sees the same seeded train/test split; each model folder gets
its ONNX file, a config.yaml with dynamic batching, labels, and a metrics.json
holding its held-out accuracy and the split's indices.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

SEED = 0
TEST_FRACTION = 0.25
N_FEATURES = 64
CLASSES = [str(i) for i in range(10)]


@dataclass(frozen=True)
class Split:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    train_idx: np.ndarray
    test_idx: np.ndarray


def load_split() -> Split:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    idx = np.arange(len(data.target))
    train_idx, test_idx = train_test_split(
        idx, test_size=TEST_FRACTION, random_state=SEED, stratify=data.target
    )
    x = data.data.astype(np.float32)
    return Split(
        x[train_idx],
        data.target[train_idx],
        x[test_idx],
        data.target[test_idx],
        train_idx,
        test_idx,
    )


def classifiers() -> dict:
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return {
        "digits_logreg": make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)),
        "digits_mlp": make_pipeline(
            StandardScaler(),
            MLPClassifier(hidden_layer_sizes=(64,), max_iter=1000, random_state=SEED),
        ),
        "digits_forest": RandomForestClassifier(n_estimators=100, random_state=SEED),
    }


def export_onnx(model: object) -> bytes:
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    onx = to_onnx(
        model,
        initial_types=[("input", FloatTensorType([None, N_FEATURES]))],
        options={id(model): {"zipmap": False}},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    return onx.SerializeToString()


MODEL_CONFIG = {
    "platform": "onnxruntime_onnx",
    "max_batch_size": 64,
    "dynamic_batching": {"max_queue_delay_ms": 1.0},
    "max_queue_size": 512,
    "labels": "labels.txt",
    "onnxruntime": {"intra_op_threads": 1, "inter_op_threads": 1},
}


def build(repository: Path, version: int = 1) -> list[Path]:
    """Train and export every classifier into repository/<name>/<version>/model.onnx."""
    split = load_split()
    written = []
    for name, clf in classifiers().items():
        clf.fit(split.x_train, split.y_train)
        accuracy = float((clf.predict(split.x_test) == split.y_test).mean())
        folder = repository / name
        (folder / str(version)).mkdir(parents=True, exist_ok=True)
        (folder / str(version) / "model.onnx").write_bytes(export_onnx(clf))
        (folder / "config.yaml").write_text(yaml.safe_dump({"name": name, **MODEL_CONFIG}))
        (folder / "labels.txt").write_text("\n".join(CLASSES) + "\n")
        (folder / "metrics.json").write_text(
            json.dumps(
                {
                    "test_accuracy": accuracy,
                    "seed": SEED,
                    "train_indices": split.train_idx.tolist(),
                    "test_indices": split.test_idx.tolist(),
                }
            )
        )
        written.append(folder)
        print(f"{name}: held-out accuracy {accuracy:.4f}")
    return written
