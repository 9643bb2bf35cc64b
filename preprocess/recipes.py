"""Recipes served as v2 models: each runs its operations in a worker thread."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from preprocess import config as cfg
from preprocess.images import ImageLimits
from preprocess.ops import OPS
from preprocess.state import State
from v2server.config import TensorConfig
from v2server.model import Scheduling, TensorSpec
from v2server.registry import Registry
from v2server.served import ServedModel

INLINE_MAX_BYTES = 64 * 1024
"""Small uploads of quick recipes skip the thread hand-off."""


def _specs(tensors: list[TensorConfig]) -> tuple[TensorSpec, ...]:
    # Both are set in a recipe file (RecipeConfig checks it).
    return tuple(
        TensorSpec(t.name, t.datatype or "", tuple(t.shape or ()), t.optional) for t in tensors
    )


class Recipe:
    """One named recipe; `run` is the whole transform, usable in-process too."""

    platform = "opencv_recipe"
    version = "1"
    labels: dict[str, list[str]] = {}

    def __init__(
        self,
        name: str,
        config: cfg.RecipeConfig,
        limits: ImageLimits,
        scheduling: Scheduling | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.limits = limits
        self.inputs = _specs(config.inputs)
        self.outputs = _specs(config.outputs)
        self.scheduling = replace(scheduling or Scheduling(), max_batch_size=config.max_batch_size)
        self._steps = [next(iter(step.items())) for step in config.steps]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        state = State(dict(inputs), self.limits)
        for name, params in self._steps:
            OPS[name](state, **params)
        missing = [s.name for s in self.outputs if s.name not in state.tensors]
        if missing:
            raise RuntimeError(f"recipe '{self.name}' produced no {missing}")
        return {s.name: state.tensors[s.name] for s in self.outputs}

    def warmup_inputs(self) -> None:
        return None  # a recipe needs an image; the first request pays OpenCV's set-up


def load(path: Path, scheduling: Scheduling | None = None) -> dict[str, Recipe]:
    """Every recipe of a recipe file, by name."""
    parsed = cfg.load(path)
    limits = ImageLimits(**parsed.limits.model_dump())
    return {name: Recipe(name, rc, limits, scheduling) for name, rc in parsed.recipes.items()}


def registry(
    path: Path, workers: int = 2, max_queue: int = 256, inline_below_ms: float = 0.0
) -> Registry:
    """Every recipe of the file, all sharing one pool of `workers` threads."""
    scheduling = Scheduling(
        instances=workers,
        max_queue=max_queue,
        inline_below_s=inline_below_ms / 1000,
        inline_max_bytes=INLINE_MAX_BYTES,
    )
    pool = ThreadPoolExecutor(workers, thread_name_prefix="recipe")
    return Registry(
        lambda: [ServedModel(r, pool) for r in load(path, scheduling).values()],
        noun="recipe",
        executor=pool,
    )
