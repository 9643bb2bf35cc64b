"""A Triton-style model repository: DIR/<model>/config.yaml + DIR/<model>/<version>/model.onnx."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import onnxruntime

from predictors.config import CONFIG_FILES, ConfigError, ModelConfig, load_config
from predictors.onnx_model import OnnxModel
from protos.errors import few
from protos.version import code_digest
from v2server.model import Served
from v2server.registry import Registry
from v2server.served import ServedModel
from v2server.triton import DIGEST_PARAMETER

MODEL_FILE = "model.onnx"

RUNTIME = "\n".join(
    (
        f"onnxruntime {onnxruntime.__version__}",
        code_digest(tuple(sorted(Path(__file__).parent.glob("*.py")))),
    )
)
"""What computes a model's answers besides its files: an upgrade of onnxruntime (its kernels
round differently from release to release) or of this package's code changes the digest, so
a Redis cache shared through a rollout never answers the new predictor's requests with the
old one's entries."""


def _version_dirs(model_dir: Path) -> dict[int, Path]:
    return {
        int(p.name): p / MODEL_FILE
        for p in model_dir.iterdir()
        if p.is_dir() and p.name.isdigit() and (p / MODEL_FILE).is_file()
    }


def _label_files(model_dir: Path, config: ModelConfig) -> dict[str, list[str]]:
    """Every label file the config names (the model's and its outputs'), by file name."""
    names = {config.labels, *(t.labels for t in config.outputs)} - {None}
    files = {}
    for name in sorted(names):  # type: ignore[type-var]
        path = model_dir / name
        if not path.is_file():
            raise ConfigError(f"{model_dir}: labels file {name} not found")
        files[name] = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return files


def _load(
    name: str, version: int, path: Path, config: ModelConfig, labels: dict[str, list[str]]
) -> OnnxModel:
    folder = path.parent.parent
    written = [folder / f for f in CONFIG_FILES if (folder / f).exists()]
    try:
        model = OnnxModel(name, version, path, config, labels)
    except ValueError as exc:  # ours: the config disagrees with the graph
        raise ConfigError(f"{(written or [folder])[0]}: {exc}") from exc
    except Exception as exc:  # onnxruntime raises several unrelated types
        raise ConfigError(f"{path}: cannot load: {exc}") from exc
    digest = _digest([path, *written], labels)
    model.reported_config.parameters[DIGEST_PARAMETER].string_value = digest
    return model


def _digest(files: list[Path], labels: dict[str, list[str]]) -> str:
    """SHA-256 of what decides the model's answers: its graph, its config file, its labels,
    and the runtime that runs them. The same files and runtime give the same digest on every
    replica."""
    digest = hashlib.sha256(RUNTIME.encode())
    for path in files:
        with path.open("rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    for name in sorted(labels):
        digest.update("\n".join([name, *labels[name], ""]).encode())
    return digest.hexdigest()


def _versions(model_dir: Path, required: bool) -> list[OnnxModel]:
    """The model's versions its policy picks, loaded; none when the folder holds no
    version (an error if `required`)."""
    available = _version_dirs(model_dir)
    if not available:
        if required:
            raise ConfigError(f"{model_dir}: no <version>/{MODEL_FILE} found")
        return []  # not a model folder
    config = load_config(model_dir)
    try:
        chosen = config.version_policy.select(list(available))
    except ValueError as exc:
        raise ConfigError(f"{model_dir}: {exc}") from exc
    labels = _label_files(model_dir, config)
    return [_load(model_dir.name, v, available[v], config, labels) for v in chosen]


def discover(root: Path, only: list[str] | None = None) -> list[OnnxModel]:
    """The selected models (all when `only` is empty) in the versions their policy picks."""
    if not root.is_dir():
        raise ConfigError(f"model repository {root} is not a folder")
    folders = {p.name: p for p in sorted(root.iterdir()) if p.is_dir()}
    wanted = only if only else sorted(folders)
    missing = [m for m in wanted if m not in folders]
    if missing:
        raise ConfigError(
            f"model repository {root} has no model {missing} (it has {few(sorted(folders))})"
        )
    models = [m for name in wanted for m in _versions(folders[name], required=bool(only))]
    if not models:
        raise ConfigError(f"model repository {root} holds no model")
    return models


class OnnxRepository:
    """The repository as model control reads it while the service runs (v2server/control.py):
    what it holds, whether a model's files changed, a model's versions built."""

    def __init__(self, root: Path, only: list[str] | None = None) -> None:
        self.root = root
        self.only = set(only) if only else None
        """The models this service may serve (`--models`); None: every one."""

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and (self.only is None or p.name in self.only) and _version_dirs(p)
        )

    def stamp(self, name: str) -> object:
        """Every file of the model's folder with its size and time: a new version folder, a
        replaced model.onnx or an edited config changes it."""
        files = []
        for path in sorted((self.root / name).rglob("*")):
            with contextlib.suppress(OSError):  # removed while listed: the next poll sees it
                info = path.stat()
                files.append((str(path.relative_to(self.root)), info.st_size, info.st_mtime_ns))
        return tuple(files)

    def build(self, name: str) -> list[Served]:
        return [ServedModel(m) for m in _versions(self.root / name, required=True)]


def registry(root: Path, only: list[str] | None = None) -> Registry:
    """Each model version with worker threads of its own (its `instance_count`); `only=[]`:
    none (model control's explicit mode, with no model named to load at start)."""
    if only == []:
        return Registry(list)
    return Registry(lambda: [ServedModel(m) for m in discover(root, only)])
