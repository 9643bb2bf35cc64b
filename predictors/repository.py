"""A Triton-style model repository: DIR/<model>/config.yaml + DIR/<model>/<version>/model.onnx."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from predictors.config import ConfigError, ModelConfig, load_config
from predictors.onnx_model import OnnxModel
from protos.errors import NotFound

log = logging.getLogger("predictors")

MODEL_FILE = "model.onnx"


def _version_dirs(model_dir: Path) -> dict[int, Path]:
    return {
        int(p.name): p / MODEL_FILE
        for p in model_dir.iterdir()
        if p.is_dir() and p.name.isdigit() and (p / MODEL_FILE).is_file()
    }


def _labels(model_dir: Path, config: ModelConfig) -> list[str] | None:
    if config.labels is None:
        return None
    path = model_dir / config.labels
    if not path.is_file():
        raise ConfigError(f"{model_dir}: labels file {config.labels} not found")
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]


def _load(
    name: str, version: int, path: Path, config: ModelConfig, labels: list[str] | None
) -> OnnxModel:
    try:
        return OnnxModel(name, version, path, config, labels)
    except Exception as exc:  # onnxruntime raises several unrelated types
        raise ConfigError(f"{path}: cannot load: {exc}") from exc


class OnnxRepository:
    """Loads the selected models and versions of a repository folder."""

    def __init__(self, root: Path, only: list[str] | None = None) -> None:
        self.root = root
        self.only = only
        self._models: dict[str, dict[str, OnnxModel]] = {}
        self._ready = False

    def _discover(self) -> dict[str, dict[str, OnnxModel]]:
        if not self.root.is_dir():
            raise ConfigError(f"model repository {self.root} is not a folder")
        folders = {p.name: p for p in sorted(self.root.iterdir()) if p.is_dir()}
        wanted = self.only if self.only else sorted(folders)
        missing = [m for m in wanted if m not in folders]
        if missing:
            raise ConfigError(
                f"model repository {self.root} has no model {missing} (it has {sorted(folders)})"
            )
        models: dict[str, dict[str, OnnxModel]] = {}
        for name in wanted:
            model_dir = folders[name]
            config = load_config(model_dir)
            available = _version_dirs(model_dir)
            if not available:
                if self.only:
                    raise ConfigError(f"{model_dir}: no <version>/{MODEL_FILE} found")
                continue  # not a model folder
            try:
                chosen = config.version_policy.select(list(available))
            except ValueError as exc:
                raise ConfigError(f"{model_dir}: {exc}") from exc
            labels = _labels(model_dir, config)
            models[name] = {str(v): _load(name, v, available[v], config, labels) for v in chosen}
            log.info("loaded", extra={"fields": {"model": name, "versions": chosen}})
        if not models:
            raise ConfigError(f"model repository {self.root} holds no model")
        return models

    async def start(self) -> None:
        self._models = await asyncio.to_thread(self._discover)
        await asyncio.gather(*(m.start() for vs in self._models.values() for m in vs.values()))
        self._ready = True

    async def stop(self) -> None:
        self._ready = False
        await asyncio.gather(*(m.stop() for vs in self._models.values() for m in vs.values()))

    @property
    def ready(self) -> bool:
        return self._ready

    def names(self) -> list[str]:
        return sorted(self._models)

    def versions(self, name: str) -> list[str]:
        return sorted(self._lookup(name), key=int)

    def _lookup(self, name: str) -> dict[str, OnnxModel]:
        try:
            return self._models[name]
        except KeyError:
            raise NotFound(
                f"unknown model '{name}' (this server has: {', '.join(self.names()) or 'none'})"
            ) from None

    def resolve(self, name: str, version: str = "") -> OnnxModel:
        versions = self._lookup(name)
        if not version:
            return versions[max(versions, key=int)]
        try:
            return versions[version]
        except KeyError:
            raise NotFound(
                f"model '{name}' has no version '{version}' "
                f"(loaded: {', '.join(self.versions(name))})"
            ) from None
