"""Recipes served as v2 models: each runs its operations in a worker thread."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from preprocess import config as cfg
from preprocess.images import ImageLimits
from preprocess.ops import OPS
from preprocess.state import State
from protos.errors import NotFound
from v2server.batcher import Batcher
from v2server.model import Scheduling, TensorSpec
from v2server.statistics import ModelStatistics


def _specs(tensors: list[cfg.TensorConfig]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(t.name, t.datatype, tuple(t.shape), t.optional) for t in tensors)


class Recipe:
    """One named recipe; `run` is the whole transform, usable in-process too."""

    platform = "opencv_recipe"
    version = "1"
    labels = None

    def __init__(self, name: str, config: cfg.RecipeConfig, limits: ImageLimits) -> None:
        self.name = name
        self.config = config
        self.limits = limits
        self.inputs = _specs(config.inputs)
        self.outputs = _specs(config.outputs)
        self._steps = [next(iter(step.items())) for step in config.steps]
        self._batcher: Batcher | None = None
        self.scheduling = Scheduling()
        self.statistics = ModelStatistics()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        state = State(dict(inputs), self.limits)
        for name, params in self._steps:
            OPS[name](state, **params)
        missing = [s.name for s in self.outputs if s.name not in state.tensors]
        if missing:
            raise RuntimeError(f"recipe '{self.name}' produced no {missing}")
        return {s.name: state.tensors[s.name] for s in self.outputs}

    @property
    def ready(self) -> bool:
        return self._batcher is not None

    def attach(self, batcher: Batcher, instances: int) -> None:
        self._batcher = batcher
        self.scheduling = Scheduling(instances=instances)
        self.statistics = batcher.statistics
        batcher.start()

    async def infer(
        self, inputs: dict[str, np.ndarray], deadline: float | None
    ) -> dict[str, np.ndarray]:
        assert self._batcher is not None, "recipe not started"
        return await self._batcher.submit(inputs, 0, deadline)

    async def stop(self) -> None:
        if self._batcher is not None:
            await self._batcher.stop()


class RecipeRepository:
    """Every recipe of a recipe file, sharing one pool of worker threads."""

    def __init__(
        self, path: Path, workers: int = 2, max_queue: int = 256, inline_below_ms: float = 0.0
    ) -> None:
        self.path = path
        self.inline_below_ms = inline_below_ms
        self.workers = workers
        self.max_queue = max_queue
        self._recipes: dict[str, Recipe] = {}
        self._executor: ThreadPoolExecutor | None = None

    def load(self) -> dict[str, Recipe]:
        parsed = cfg.load(self.path)
        limits = ImageLimits(parsed.limits.max_encoded_bytes, parsed.limits.max_pixels)
        return {name: Recipe(name, rc, limits) for name, rc in parsed.recipes.items()}

    async def start(self) -> None:
        recipes = await asyncio.to_thread(self.load)
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="recipe")
        for recipe in recipes.values():
            recipe.attach(
                Batcher(
                    recipe.run,
                    self._executor,
                    name=recipe.name,
                    max_batch_rows=0,
                    max_delay_s=0.0,
                    max_queue=self.max_queue,
                    instances=self.workers,
                    # Small uploads of quick recipes skip the thread hand-off.
                    inline_below_s=self.inline_below_ms / 1000,
                    inline_max_bytes=64 * 1024,
                ),
                self.workers,
            )
        self._recipes = recipes

    async def stop(self) -> None:
        await asyncio.gather(*(r.stop() for r in self._recipes.values()))
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    @property
    def ready(self) -> bool:
        return bool(self._recipes) and all(r.ready for r in self._recipes.values())

    def names(self) -> list[str]:
        return sorted(self._recipes)

    def versions(self, name: str) -> list[str]:
        return [self.resolve(name).version]

    def resolve(self, name: str, version: str = "") -> Recipe:
        recipe = self._recipes.get(name)
        if recipe is None:
            raise NotFound(
                f"unknown recipe '{name}' (this server has: {', '.join(self.names()) or 'none'})"
            )
        if version and version != recipe.version:
            raise NotFound(f"recipe '{name}' has no version '{version}' (loaded: 1)")
        return recipe
