"""Real v2 gRPC servers (the shared server core, port 0) hosting small scripted models."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from v2server.model import Scheduling, TensorSpec
from v2server.registry import Registry
from v2server.server import V2Server
from v2server.settings import ServerSettings
from v2server.statistics import ModelStatistics

Fn = Callable[[dict[str, np.ndarray], float | None], Awaitable[dict[str, np.ndarray]]]


@dataclass
class ScriptedModel:
    name: str
    fn: Fn
    inputs: tuple[TensorSpec, ...] = (TensorSpec("x", "FP32", (-1, -1)),)
    outputs: tuple[TensorSpec, ...] = (TensorSpec("y", "FP32", (-1, -1)),)
    platform: str = "scripted"
    labels: dict[str, list[str]] = field(default_factory=dict)
    decoding: tuple[str, int] | None = None
    """(input, min_pixels) reported in its ModelConfig, as a recipe that decodes does."""
    version: str = "1"
    scheduling: Scheduling = field(default_factory=Scheduling)
    statistics: ModelStatistics = field(default_factory=ModelStatistics)
    calls: int = 0
    cancelled: int = 0
    remaining_s: list[float] = field(default_factory=list)
    """What was left of the caller's deadline when each call arrived."""

    @property
    def ready(self) -> bool:
        return True

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def infer(self, inputs: dict[str, np.ndarray], deadline: float | None):
        self.calls += 1
        if deadline is not None:
            self.remaining_s.append(deadline - asyncio.get_running_loop().time())
        try:
            return await self.fn(inputs, deadline)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def serve(*models: ScriptedModel, **settings: Any) -> V2Server:
    server = V2Server(
        Registry.of(*models),
        ServerSettings(**{"port": 0, "grace_s": 0.5, "linger_s": 0, **settings}),
        server_name="scripted",
        server_version="0",
    )
    await server.start()
    return server


def affine(name: str, scale: float, shift: float, delay_s: float = 0.0) -> ScriptedModel:
    async def fn(inputs, deadline):
        if delay_s:
            await asyncio.sleep(delay_s)
        return {"y": (inputs["x"] * scale + shift).astype(np.float32)}

    return ScriptedModel(name, fn)
