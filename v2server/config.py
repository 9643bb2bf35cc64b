"""Configuration shared by the services' files (model configs, recipe files)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

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
    max_shape: list[int] | None = None
    """An input's largest size along each dimension, batch included (-1: no bound): a
    model whose memory grows faster than its input (a recogniser's attention over a line's
    width) must not take what one request can make it take. Refused before decoding."""
    max_elements: int | None = Field(default=None, gt=0)
    """An input's largest element count (the product of its shape): where memory grows
    with the area, not a side (a detector: a receipt 700x6600 costs what a square page of
    2000 does, a page 6600x6600 eleven times that), a bound per side cannot tell them
    apart. Refused before decoding."""
    multiple_of: list[int] | None = None
    """What each dimension of an input must be a multiple of (1 or -1: anything): a
    detector whose feature maps halve five times needs sides that are multiples of 32, and
    answered others with an internal error from deep inside its graph."""

    @field_validator("datatype")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is not None and value not in DATATYPE_TO_DTYPE:
            raise ValueError(f"unknown datatype '{value}'")
        return value

    @model_validator(mode="after")
    def _bounds_fit_the_shape(self) -> TensorConfig:
        for what in ("max_shape", "multiple_of"):
            given = getattr(self, what)
            if given is not None and self.shape is not None and len(given) != len(self.shape):
                raise ValueError(
                    f"tensor '{self.name}': {what} {given} has {len(given)} dimensions, its "
                    f"shape {self.shape} has {len(self.shape)}"
                )
        return self
