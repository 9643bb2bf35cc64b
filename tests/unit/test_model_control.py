"""Model control in process (v2server/control.py): a reload puts the new versions in place at
once, the replaced one finishes what it holds, and a failed load changes nothing. The real
service, its repository and tritonclient: tests/contract/test_model_control.py."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from prometheus_client import REGISTRY

from protos.errors import InvalidInput, Unsupported
from v2server.control import ModelControl
from v2server.model import LoadError, Scheduling, TensorSpec
from v2server.registry import Registry
from v2server.served import ServedModel


class Adds:
    """y = x + version, after `delay_s` (in the model's thread)."""

    def __init__(self, version: int, delay_s: float) -> None:
        self.name, self.version, self.platform = "m", str(version), "test"
        self.inputs = (TensorSpec("x", "FP32", (1,)),)
        self.outputs = (TensorSpec("y", "FP32", (1,)),)
        self.labels: dict[str, list[str]] = {}
        self.scheduling = Scheduling()
        self.delay_s = delay_s

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(self.delay_s)
        return {"y": inputs["x"] + float(self.version)}

    def warmup_inputs(self) -> None:
        return None


class Files:
    """A repository whose one model is at `version` (broken: it cannot be loaded)."""

    def __init__(self) -> None:
        self.version, self.broken, self.delay_s = 1, False, 0.0
        self.built: list[ServedModel] = []
        self.tried = 0
        self.build_s = 0.0

    def names(self) -> list[str]:
        return ["m"]

    def stamp(self, name: str) -> object:
        return (self.version, self.broken)

    def build(self, name: str) -> list[ServedModel]:
        self.tried += 1
        time.sleep(self.build_s)  # in a thread, as reading a large model's files
        if self.broken:
            raise LoadError("m/2/model.onnx: cannot load: not a model")
        self.built.append(ServedModel(Adds(self.version, self.delay_s)))
        return self.built[-1:]


async def _serving(files: Files, mode: str = "explicit") -> tuple[Registry, ModelControl]:
    registry = Registry(lambda: files.build("m"))
    await registry.start()
    control = ModelControl(registry, files, mode, linger_s=0.05, grace_s=5)  # type: ignore[arg-type]
    await control.start()
    return registry, control


async def _infer(registry: Registry) -> float:
    outputs = await registry.resolve("m").infer({"x": np.zeros(1, np.float32)}, None)
    return float(outputs["y"][0])


async def test_a_reload_lets_the_replaced_version_finish_what_it_holds() -> None:
    files = Files()
    files.delay_s = 0.5  # longer than the linger: the retired version must wait for it
    registry, control = await _serving(files)
    held = asyncio.create_task(_infer(registry))
    await asyncio.sleep(0.1)
    files.version, files.delay_s = 2, 0.0
    await control.load("m")
    assert await _infer(registry) == 2.0  # the new version, at once
    old = files.built[0]
    assert old.ready, "still finishing the request it holds"
    assert await held == 1.0
    await asyncio.sleep(0.1)
    assert not old.ready, "stopped once drained"
    await control.stop()
    await registry.stop()


async def test_a_failed_load_leaves_the_serving_version() -> None:
    files = Files()
    registry, control = await _serving(files)
    files.version, files.broken = 2, True
    with pytest.raises(InvalidInput, match=r"not a model; still serving version\(s\) 1"):
        await control.load("m")
    assert await _infer(registry) == 1.0
    assert registry.versions("m") == ["1"] and "m" not in control.reasons
    await control.stop()
    await registry.stop()


async def test_poll_mode_loads_changed_files_once() -> None:
    files = Files()
    registry, control = await _serving(files, "poll")
    with pytest.raises(Unsupported, match="model control mode is poll"):
        await control.load("m")
    await control.rescan()
    assert len(files.built) == 1, "unchanged: not loaded again"
    files.version = 2
    await control.rescan()
    assert await _infer(registry) == 2.0 and len(files.built) == 2
    files.version, files.broken = 3, True
    await control.rescan()
    await control.rescan()  # broken as it was: not tried again until its files change
    assert await _infer(registry) == 2.0 and files.tried == 3
    await control.stop()
    await registry.stop()


async def test_a_failing_load_is_a_metric_until_one_succeeds() -> None:
    """What MeshModelLoadFailing alerts on (deploy/observability/prometheus-rules.yaml)."""
    files = Files()
    registry, control = await _serving(files)

    def failing() -> float | None:
        return REGISTRY.get_sample_value("v2_model_load_failing", {"model": "m"})

    before = REGISTRY.get_sample_value("v2_model_loads_total", {"model": "m", "outcome": "failed"})
    assert failing() == 0
    files.version, files.broken = 2, True
    with pytest.raises(InvalidInput):
        await control.load("m")
    assert failing() == 1
    failed = REGISTRY.get_sample_value("v2_model_loads_total", {"model": "m", "outcome": "failed"})
    assert failed == (before or 0) + 1
    files.broken = False
    await control.load("m")
    assert failing() == 0
    await control.stop()
    await registry.stop()


async def test_a_load_whose_caller_leaves_still_ends() -> None:
    files = Files()
    registry, control = await _serving(files)
    files.version, files.build_s = 2, 0.3
    caller = asyncio.create_task(control.load("m"))
    await asyncio.sleep(0.05)
    caller.cancel()  # its deadline passed while the model loaded
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert await _infer(registry) == 1.0
    await asyncio.sleep(0.5)
    assert await _infer(registry) == 2.0, "loaded all the same"
    await control.stop()
    await registry.stop()
