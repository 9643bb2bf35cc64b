"""The per-model configuration file of a model repository (config.yaml / config.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from protos import pb
from protos.strict import Strict
from v2server.config import TensorConfig
from v2server.model import LoadError


class DynamicBatching(Strict):
    max_queue_delay_ms: float = Field(default=2.0, ge=0)
    """How long the first request of a batch waits for others to join it."""
    preferred_batch_size: list[int] = []
    """A batch stops waiting for company once it holds the largest of these rows (Triton's
    field; smaller ones change nothing here: an idle model never waits)."""


class VersionPolicy(Strict):
    """Which of the numbered version folders are loaded: exactly one of the three."""

    latest: int | None = Field(default=None, ge=1)
    all: bool = False
    specific: list[int] | None = None

    @model_validator(mode="after")
    def _one_mode(self) -> VersionPolicy:
        modes = (self.latest is not None) + self.all + (self.specific is not None)
        if modes > 1:
            raise ValueError("version_policy takes one of: latest, all, specific")
        return self

    def select(self, available: list[int]) -> list[int]:
        ordered = sorted(available)
        if self.all:
            return ordered
        if self.specific is not None:
            missing = sorted(set(self.specific) - set(ordered))
            if missing:
                raise ValueError(f"version_policy.specific names missing versions {missing}")
            return sorted(self.specific)
        return ordered[-(self.latest or 1) :]


ArenaPolicy = Literal["keep", "outliers", "always"]


class OrtOptions(Strict):
    intra_op_threads: int = Field(default=0, ge=0)
    """0 lets ONNX Runtime decide (one per core)."""
    inter_op_threads: int = Field(default=0, ge=0)
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"
    allow_spinning: bool = False
    """Idle intra-op threads busy-wait for work; off by default because they would
    steal the cores that gRPC and the other services share."""
    arena: ArenaPolicy = "keep"
    """What the memory arena keeps after an execution (predictors/arena.py): `keep` all
    it grew to (ONNX Runtime's default), `outliers` gives back what an execution with
    inputs over twice the largest of the last 32 took, `always` gives it back every time
    (Triton's `memory.enable_memory_arena_shrinkage`)."""


class Ragged(Strict):
    """Rows of one input padded to a common length along one axis, each run alone.

    A request carries the padded input and each row's true length (`lengths`, an INT32 or
    INT64 [N] input of its own that the model never sees). The server runs every row by
    itself, cut to its length, and pads each listed output back to the longest row along
    its axis with zeros. A row's answer then never depends on what shares its batch, and
    no time goes into padding: for a text recogniser whose cost grows with the line's
    width, cheaper than one padded batch and more accurate.
    """

    input: str
    axis: int = Field(ge=1)
    """The padded axis of `input` (0 is the batch)."""
    lengths: str
    """Name of the extra input holding each row's length along `axis`."""
    outputs: dict[str, int] = Field(min_length=1)
    """Outputs whose axis (the value) grows with the row's length: padded back with zeros."""


class ModelTensor(TensorConfig):
    """A model's input or output as its config declares it."""

    reshape: list[int] | None = None
    """The shape the graph takes (an input) or gives (an output), without the batch
    dimension when the model batches; `shape` is what callers send or get (Triton's
    `reshape`)."""
    labels: str | None = None
    """An output's class names: a file beside the config, one per line (Triton's
    `label_filename`). Only outputs that name one have labels."""


class ModelConfig(Strict):
    name: str | None = None
    """Defaults to the model's folder name; must match it when given."""
    platform: Literal["onnxruntime_onnx"] = "onnxruntime_onnx"
    max_batch_size: int = Field(default=0, ge=0)
    """Largest first dimension a request or a merged batch may have; 0: no limit, no merging."""
    dynamic_batching: DynamicBatching | None = None
    """Present: concurrent requests are merged, up to max_batch_size rows."""
    max_queue_size: int = Field(default=256, ge=1)
    """Requests that may wait for an execution; more are refused (RESOURCE_EXHAUSTED)."""
    instance_count: int = Field(default=1, ge=1)
    """Executions of this model that may run at once."""
    inline_below_ms: float = Field(default=0.3, ge=0)
    """Executions whose average time is below this run on the event loop, saving the
    thread hand-off (0 disables)."""
    version_policy: VersionPolicy = VersionPolicy()
    inputs: list[ModelTensor] = []
    outputs: list[ModelTensor] = []
    labels: str | None = None
    """A file beside config.yaml, one class label per line: the labels of every float output
    whose last dimension has that many entries (class scores); an output's own `labels`
    wins. At least one output must match."""
    warmup: dict[str, list[int]] = {}
    """Shapes of the warm-up inference's inputs; default: dynamic dimensions become 1."""
    warmup_random: list[str] = []
    """Inputs the warm-up fills with random values (seeded) instead of zeros."""
    onnxruntime: OrtOptions = OrtOptions()
    ragged: Ragged | None = None
    """Present: rows of `ragged.input` run one at a time at their own length."""

    _triton: pb.ModelConfig | None = PrivateAttr(default=None)
    """The config.pbtxt this was read from: what the model reports (predictors/reported.py)."""

    @model_validator(mode="after")
    def _batching_needs_a_size(self) -> ModelConfig:
        if self.dynamic_batching is not None and self.max_batch_size == 0:
            raise ValueError("dynamic_batching needs max_batch_size > 0")
        if self.ragged is not None and self.max_batch_size == 0:
            raise ValueError("ragged needs max_batch_size > 0 (rows are along the first axis)")
        return self


class ConfigError(LoadError, ValueError):
    """A model folder whose configuration cannot be used; the message names the file."""


CONFIG_FILES = ("config.yaml", "config.yml", "config.json", "config.pbtxt")


def load_config(model_dir: Path) -> ModelConfig:
    """Read `config.yaml`, `config.yml`, `config.json` or Triton's `config.pbtxt` (absent:
    all defaults)."""
    found = [model_dir / f for f in CONFIG_FILES if (model_dir / f).exists()]
    if not found:
        return ModelConfig()
    if len(found) > 1:
        raise ConfigError(f"{model_dir}: one configuration file, not {[p.name for p in found]}")
    path = found[0]
    if path.suffix == ".pbtxt":
        from predictors import triton_config  # here: it imports this module

        config = triton_config.read(path)
    else:
        try:
            text = path.read_text()
            raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
            config = ModelConfig.model_validate(raw or {})
        except (ValidationError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    if config.name is not None and config.name != model_dir.name:
        raise ConfigError(f"{path}: name '{config.name}' differs from folder '{model_dir.name}'")
    return config
