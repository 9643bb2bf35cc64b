"""Digits classifiers: trained on scikit-learn's bundled digits data, exported with skl2onnx.

The classifiers see what the service sees: every training sample is drawn as several
images (`models.augment`) and passed through the shipped `digits` recipe, and the
classifiers learn from the recipe's features. Every classifier sees the same seeded
train/test split; the held-out split is never drawn for training. Each model folder gets its
ONNX file, a config.yaml with dynamic batching, labels, and a metrics.json holding the
held-out accuracy, the split's indices and a digest of the training features (the same
digest on every build: the output is reproducible).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from models import augment

SEED = 0
TEST_FRACTION = 0.25
N_FEATURES = 64
DRAWS_PER_SAMPLE = 8
CLASSES = [str(i) for i in range(10)]
ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    "models/digits.py",
    "models/augment.py",
    "preprocess/images.py",
    "preprocess/ops.py",
    "preprocess/ink.py",
)
"""What the classifiers depend on besides the `digits` recipe and the libraries: a change
retrains them."""


def fingerprint() -> str:
    import cv2
    import skl2onnx
    import sklearn

    from preprocess import config
    from preprocess.settings import DEFAULT_RECIPES

    recipes = config.parse(DEFAULT_RECIPES)
    digest = hashlib.sha256(
        json.dumps(
            [recipes.limits.model_dump(), recipes.recipes["digits_input"].model_dump()],
            sort_keys=True,
        ).encode()
    )
    for name in SOURCES:
        digest.update((ROOT / name).read_bytes())
    for version in (sklearn.__version__, cv2.__version__, skl2onnx.__version__):
        digest.update(version.encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Split:
    images: np.ndarray
    """Every sample's 8x8 values (0..16)."""
    target: np.ndarray
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
    return Split(data.images, data.target, train_idx, test_idx)


def recipe_features(blobs: list[bytes]) -> list[np.ndarray | None]:
    """The shipped `digits` recipe's features of each encoded image, in-process; None for
    an image the recipe refuses (a drawing whose ink the augmentation wiped out)."""
    from preprocess import config
    from preprocess.images import ImageLimits
    from preprocess.recipes import Recipe
    from preprocess.settings import DEFAULT_RECIPES
    from protos.errors import InvalidInput

    # Only the digits recipe: the others name files of models that may not be built yet.
    recipes = config.parse(DEFAULT_RECIPES)
    limits = ImageLimits(**recipes.limits.model_dump())
    recipe = Recipe("digits_input", recipes.recipes["digits_input"], limits)
    out: list[np.ndarray | None] = []
    for blob in blobs:
        one = np.empty(1, dtype=object)
        one[0] = blob
        try:
            out.append(recipe.run({"image": one})["input"][0])
        except InvalidInput:
            out.append(None)
    return out


def training_set(split: Split) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    blobs, labels = [], []
    for _ in range(DRAWS_PER_SAMPLE):
        for i in split.train_idx:
            blobs.append(augment.render(split.images[i], rng))
            labels.append(split.target[i])
    pairs = [(f, y) for f, y in zip(recipe_features(blobs), labels, strict=True) if f is not None]
    print(f"digits: {len(blobs) - len(pairs)} of {len(blobs)} drawings had no ink left, dropped")
    return np.stack([f for f, _ in pairs]), np.array([y for _, y in pairs])


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
            MLPClassifier(hidden_layer_sizes=(128,), max_iter=500, random_state=SEED),
        ),
        "digits_forest": RandomForestClassifier(
            n_estimators=100, min_samples_leaf=2, random_state=SEED
        ),
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


def is_current(repository: Path) -> bool:
    """Every classifier is there and was made from these sources and libraries."""
    current = fingerprint()
    for name in classifiers():
        try:
            meta = json.loads((repository / name / "metrics.json").read_text())
        except (OSError, ValueError):
            return False
        if (
            meta.get("fingerprint") != current
            or not (repository / name / "1" / "model.onnx").is_file()
        ):
            return False
    return True


def build(repository: Path, version: int = 1) -> list[Path]:
    """Train and export every classifier into repository/<name>/<version>/model.onnx."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    split = load_split()
    x_train, y_train = training_set(split)
    digest = hashlib.sha256(x_train.tobytes()).hexdigest()
    print(f"digits: {len(x_train)} training images drawn and passed through the recipe")
    # The held-out split, drawn once the plainest way (nearest-neighbour, 32 px, no margin).
    plain = np.stack(recipe_features([_plain(split.images[i]) for i in split.test_idx]))
    written = []
    for name, clf in classifiers().items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(x_train, y_train)
        accuracy = float((clf.predict(plain) == split.target[split.test_idx]).mean())
        folder = repository / name
        (folder / str(version)).mkdir(parents=True, exist_ok=True)
        (folder / str(version) / "model.onnx").write_bytes(export_onnx(clf))
        (folder / "config.yaml").write_text(yaml.safe_dump({"name": name, **MODEL_CONFIG}))
        (folder / "labels.txt").write_text("\n".join(CLASSES) + "\n")
        (folder / "metrics.json").write_text(
            json.dumps(
                {
                    "fingerprint": fingerprint(),
                    "held_out_accuracy_plain_drawing": accuracy,
                    "seed": SEED,
                    "training_images": len(x_train),
                    "training_features_sha256": digest,
                    "train_indices": split.train_idx.tolist(),
                    "test_indices": split.test_idx.tolist(),
                }
            )
        )
        written.append(folder)
        print(f"{name}: held-out accuracy {accuracy:.4f} (plain drawing)")
    return written


def _plain(values: np.ndarray) -> bytes:
    import cv2

    gray = np.round(255 - values * (255 / 16)).astype(np.uint8)
    ok, buf = cv2.imencode(".png", cv2.resize(gray, (32, 32), interpolation=cv2.INTER_NEAREST))
    assert ok
    return buf.tobytes()
