"""A Triton-style model repository: DIR/<model>/config.yaml + DIR/<model>/<version>/model.onnx."""

from __future__ import annotations

from pathlib import Path

from predictors.config import CONFIG_FILES, ConfigError, ModelConfig, load_config
from predictors.onnx_model import OnnxModel
from v2server.registry import Registry
from v2server.served import ServedModel

MODEL_FILE = "model.onnx"


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
    try:
        return OnnxModel(name, version, path, config, labels)
    except ValueError as exc:  # ours: the config disagrees with the graph
        folder = path.parent.parent
        written = next((folder / f for f in CONFIG_FILES if (folder / f).exists()), folder)
        raise ConfigError(f"{written}: {exc}") from exc
    except Exception as exc:  # onnxruntime raises several unrelated types
        raise ConfigError(f"{path}: cannot load: {exc}") from exc


def discover(root: Path, only: list[str] | None = None) -> list[OnnxModel]:
    """The selected models (all when `only` is empty) in the versions their policy picks."""
    if not root.is_dir():
        raise ConfigError(f"model repository {root} is not a folder")
    folders = {p.name: p for p in sorted(root.iterdir()) if p.is_dir()}
    wanted = only if only else sorted(folders)
    missing = [m for m in wanted if m not in folders]
    if missing:
        raise ConfigError(
            f"model repository {root} has no model {missing} (it has {sorted(folders)})"
        )
    models: list[OnnxModel] = []
    for name in wanted:
        model_dir = folders[name]
        config = load_config(model_dir)
        available = _version_dirs(model_dir)
        if not available:
            if only:
                raise ConfigError(f"{model_dir}: no <version>/{MODEL_FILE} found")
            continue  # not a model folder
        try:
            chosen = config.version_policy.select(list(available))
        except ValueError as exc:
            raise ConfigError(f"{model_dir}: {exc}") from exc
        labels = _label_files(model_dir, config)
        models += [_load(name, v, available[v], config, labels) for v in chosen]
    if not models:
        raise ConfigError(f"model repository {root} holds no model")
    return models


def registry(root: Path, only: list[str] | None = None) -> Registry:
    """Each model version with worker threads of its own (its `instance_count`)."""
    return Registry(lambda: [ServedModel(m) for m in discover(root, only)])
