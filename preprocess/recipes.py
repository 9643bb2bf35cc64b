"""Recipes served as v2 models: each runs its operations in a worker thread."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np

from preprocess import config as cfg
from preprocess import images as imgs
from preprocess.ops import OPS, PER_IMAGE, decode
from preprocess.state import State
from protos import media
from protos.version import VERSION, code_digest
from v2server.config import TensorConfig
from v2server.model import Scheduling, TensorSpec
from v2server.policy import payload_bytes

INLINE_MAX_BYTES = 64 * 1024
"""Small uploads of quick recipes skip the thread hand-off..."""
INLINE_MAX_DECODED = 1 << 20
"""...when their images take at most this once decoded (~5 ms of decoding on the loop)."""


def _specs(tensors: list[TensorConfig]) -> tuple[TensorSpec, ...]:
    # Both are set in a recipe file (RecipeConfig checks it).
    return tuple(
        TensorSpec(
            t.name,
            t.datatype or "",
            tuple(t.shape or ()),
            t.optional,
            tuple(t.max_shape or ()),
            tuple(t.multiple_of or ()),
            t.max_elements or 0,
        )
        for t in tensors
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
        limits: imgs.ImageLimits,
        scheduling: Scheduling | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.limits = limits
        self.digest = _digest(config, limits)
        """What decides its answers: its definition, the image limits, the mesh's release and
        the operations' code, digested; in its ModelConfig (v2server/triton.py)."""
        self.inputs = _specs(config.inputs)
        self.outputs = _specs(config.outputs)
        self.scheduling = replace(scheduling or Scheduling(), max_batch_size=config.max_batch_size)
        self._steps = [next(iter(step.items())) for step in config.steps]
        self._decodes = _decoded_input(self._steps)
        """The input of encoded images the recipe starts by decoding ('' if it does not)."""
        self.decoding: tuple[str, int] | None = (
            (self._decodes, int(self._steps[0][1].get("min_pixels", 0))) if self._decodes else None
        )
        """(input, min_pixels) of the recipe's decode, reported in its ModelConfig: the proxy
        counts a pipeline's images in flight as decoded (protos/decoded.py)."""
        self._grouped = _per_image_prefix(self._steps) if self._decodes else 0
        """How many first steps may run a few images at a time (0: none)."""

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        state = State(dict(inputs), self.limits)
        steps = self._steps
        groups = self._groups(state) if self._grouped else []
        if groups:
            self._run_in_groups(state, groups)
            steps = steps[self._grouped :]
        for name, params in steps:
            OPS[name](state, **params)
        missing = [s.name for s in self.outputs if s.name not in state.tensors]
        if missing:
            raise RuntimeError(f"recipe '{self.name}' produced no {missing}")
        return {s.name: state.tensors[s.name] for s in self.outputs}

    def _groups(self, state: State) -> list[slice]:
        """The rows of the encoded images input, in runs whose images take at most
        `limits.decode_group_bytes` decoded (read from their headers; one image alone may
        take more): one run when there are no such images."""
        tensor = state.tensors.get(self._decodes)
        if tensor is None or tensor.dtype != object or tensor.size < 2:
            return []
        groups, start, held = [], 0, 0
        for row, item in enumerate(tensor.reshape(-1).tolist()):
            size = imgs.declared_bytes(item) if isinstance(item, bytes) else 0
            if held and held + size > self.limits.decode_group_bytes:
                groups.append(slice(start, row))
                start, held = row, 0
            held += size
        return [*groups, slice(start, tensor.size)] if groups else []

    def _run_in_groups(self, state: State, groups: list[slice]) -> None:
        """Decode and transform a few images at a time, keeping only what the per-image
        steps leave of them: a call of 64 photos of 36 Mpx (160 KiB each as PNG) decoded
        together took the service to 2.3 GB; in groups it holds one or two."""
        name = self._decodes
        items = state.tensors[name].reshape(-1)
        images: list[np.ndarray] = []
        sizes: list[tuple[int, int]] = []
        for rows in groups:
            group = State({name: items[rows]}, state.limits, first=rows.start)
            for op, params in self._steps[: self._grouped]:
                OPS[op](group, **params)
            images += group.images
            sizes += group.sizes
        state.images, state.sizes = images, sizes

    def work_bytes(self, inputs: Mapping[str, np.ndarray]) -> int:
        """What a request weighs for running on the event loop (v2server/policy.py): the
        bytes it carries, or more than any limit when its images take more than
        INLINE_MAX_DECODED once decoded (from their headers). By its upload alone, a 16 KB
        bilevel PNG of 6000x6000 was decoded on the loop and held it 0.76 s."""
        carried = payload_bytes(inputs)
        images = inputs.get(self._decodes) if self._decodes else None
        if carried <= INLINE_MAX_BYTES and images is not None and images.dtype == object:
            decoded = 0
            for item in images.reshape(-1).tolist():
                decoded += imgs.declared_bytes(item) if isinstance(item, bytes) else 0
            if decoded > INLINE_MAX_DECODED:
                return max(carried, decoded)
        return carried

    def warmup_inputs(self) -> None:
        return None  # a recipe needs an image; the first request pays OpenCV's set-up


CODE_SOURCES = (*sorted(Path(__file__).parent.glob("*.py")), Path(media.__file__))
"""The operations' source: this package and the image headers' reader."""


CODE = code_digest(CODE_SOURCES)
"""An upgrade that changed how images are read (their EXIF orientation) kept the version,
and with it every recipe's digest."""


LIBRARIES = f"opencv {cv2.__version__}, numpy {np.__version__}"
"""What runs the operations: a new OpenCV decodes and resizes a little differently."""


def _digest(config: cfg.RecipeConfig, limits: imgs.ImageLimits) -> str:
    """The same on every replica: a `_file` parameter counts by its content, not its path."""
    steps = []
    for step in config.steps:
        ((op, params),) = step.items()
        counted = {k: _content(v) if k.endswith("_file") else v for k, v in params.items()}
        steps.append({op: counted})
    definition = config.model_copy(update={"steps": steps}).model_dump_json()
    text = "\n".join((VERSION, CODE, LIBRARIES, definition, repr(limits)))
    return hashlib.sha256(text.encode()).hexdigest()


def _content(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _decoded_input(steps: list[tuple[str, dict]]) -> str:
    """The input a recipe's first step decodes; '' when it does not start with `decode`."""
    if not steps or steps[0][0] != "decode":
        return ""
    return steps[0][1].get("input", inspect.signature(decode).parameters["input"].default)


def _per_image_prefix(steps: list[tuple[str, dict]]) -> int:
    """How many first steps of a recipe that starts with `decode` may run a few batch rows
    at a time: the decode and the per-image operations after it (0 when none follow)."""
    count = 1
    while count < len(steps) and steps[count][0] in PER_IMAGE:
        count += 1
    return count if count > 1 else 0


def load(path: Path, scheduling: Scheduling | None = None) -> dict[str, Recipe]:
    """Every recipe of a recipe file, by name."""
    parsed = cfg.load(path)
    limits = imgs.ImageLimits(**parsed.limits.model_dump())
    return {name: Recipe(name, rc, limits, scheduling) for name, rc in parsed.recipes.items()}
