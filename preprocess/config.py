"""The recipe file: named recipes, each a list of operations plus its v2 tensor metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator

from preprocess import ink as _ink  # noqa: F401  (registers the ink operations)
from preprocess import ocr as _ocr  # noqa: F401  (registers the OCR operations)
from preprocess import ocr_crops as _ocr_crops  # noqa: F401  (the boxes and the lines cut)
from preprocess import ocr_gaps as _ocr_gaps  # noqa: F401  (the lines' ink)
from preprocess import ocr_lines as _ocr_lines  # noqa: F401  (and the per-line ones)
from preprocess import ocr_text as _ocr_text  # noqa: F401  (and CTC decoding)
from preprocess.ops import check_params
from protos.strict import Strict
from v2server.config import TensorConfig
from v2server.model import LoadError


class RecipeConfig(Strict):
    inputs: list[TensorConfig] = Field(min_length=1)
    outputs: list[TensorConfig] = Field(min_length=1)
    steps: list[dict[str, dict[str, Any]]] = Field(min_length=1)
    """Each step is `{operation: {parameter: value}}`."""
    max_batch_size: int = Field(default=0, ge=0)
    """> 0: the recipe treats each row of its inputs (each image) on its own, so callers may
    send several requests' rows as one call (ModelConfig reports it; the proxy merges)."""

    @field_validator("inputs", "outputs")
    @classmethod
    def _declared(cls, tensors: list[TensorConfig]) -> list[TensorConfig]:
        for t in tensors:
            if t.datatype is None or t.shape is None:
                raise ValueError(f"tensor '{t.name}' needs its datatype and shape")
        return tensors

    @field_validator("steps")
    @classmethod
    def _known_ops(cls, steps: list[dict[str, dict[str, Any]]]) -> list[dict[str, dict[str, Any]]]:
        for i, step in enumerate(steps):
            if len(step) != 1:
                raise ValueError(f"step {i} must name exactly one operation, not {list(step)}")
            ((name, params),) = step.items()
            check_params(name, params or {})
        return steps


class LimitsConfig(Strict):
    max_encoded_bytes: int = Field(default=20 * 1024 * 1024, ge=1)
    max_pixels: int = Field(default=40_000_000, ge=1)
    max_decoded_bytes: int = Field(default=160_000_000, ge=1)
    max_batch_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    decode_group_bytes: int = Field(default=32_000_000, ge=1)


class RecipeFile(Strict):
    limits: LimitsConfig = LimitsConfig()
    recipes: dict[str, RecipeConfig] = Field(min_length=1)


class RecipeFileError(LoadError, ValueError):
    """The recipe file cannot be used; the message names the file and the problem."""


def parse(path: Path) -> RecipeFile:
    """The recipe file checked, its `_file` parameters not yet resolved."""
    try:
        raw = yaml.safe_load(path.read_text())
        return RecipeFile.model_validate(raw or {})
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise RecipeFileError(f"{path}: {exc}") from exc


def load(path: Path) -> RecipeFile:
    """The recipe file checked, with every file it names found."""
    return _resolve_paths(parse(path), path.parent)


def _resolve_paths(parsed: RecipeFile, base: Path) -> RecipeFile:
    """Parameters ending in `_file` are relative to the recipe file."""
    recipes = {}
    for name, recipe in parsed.recipes.items():
        steps = []
        for step in recipe.steps:
            ((op, params),) = step.items()
            params = dict(params or {})
            for key, value in params.items():
                if key.endswith("_file"):
                    resolved = (base / value).resolve()
                    if not resolved.is_file():
                        raise RecipeFileError(f"recipe '{name}', {op}.{key}: {resolved} not found")
                    params[key] = str(resolved)
            steps.append({op: params})
        recipes[name] = recipe.model_copy(update={"steps": steps})
    return parsed.model_copy(update={"recipes": recipes})
