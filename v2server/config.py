"""Configuration shared by the services' files (model configs, recipe files)."""

from __future__ import annotations

from pydantic import field_validator

from protos.codec import DATATYPE_TO_DTYPE
from protos.strict import Strict


class TensorConfig(Strict):
    """One tensor as a configuration file declares it: a recipe's inputs and outputs (every
    field given), or a model config's overrides of what the ONNX graph says (name and what
    differs)."""

    name: str
    datatype: str | None = None
    shape: list[int] | None = None
    optional: bool = False

    @field_validator("datatype")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is not None and value not in DATATYPE_TO_DTYPE:
            raise ValueError(f"unknown datatype '{value}'")
        return value
