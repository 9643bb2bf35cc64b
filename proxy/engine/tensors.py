"""The tensors a pipeline takes (`inputs`) and answers as a v2 model (`outputs`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from protos.strict import Strict

DataType = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
]  # fmt: skip


class InputTensor(Strict):
    """One tensor a pipeline takes (`inputs`), as v2 declares a model's input."""

    datatype: DataType
    shape: list[int] = Field(min_length=1)
    """Full shape, -1 for a dimension that varies."""
    min: float | None = None
    max: float | None = None
    """The values its models were made for, bounds included: an element outside them (NaN
    too) is the client's 400, not a confident answer from a model fed what it never saw
    (0..255 pixels sent for 0..16 features), nor a 502 once its outputs come back NaN."""

    @property
    def bounded(self) -> bool:
        return self.min is not None or self.max is not None

    @model_validator(mode="after")
    def _bounds_fit(self) -> InputTensor:
        if self.bounded and self.datatype in ("BYTES", "BOOL"):
            raise ValueError(f"min and max bound numbers, not {self.datatype} elements")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min:g} is above max {self.max:g}")
        return self


class OutputTensor(Strict):
    """One output of the pipeline as a v2 model (the proxy's gRPC and /v2 REST door)."""

    tensor: str
    """Reference to the tensor: `<step>.<tensor>`."""
    datatype: DataType
    shape: list[int] = Field(min_length=1)
    """Full shape, -1 for a dimension that varies; a tensor a switch skipped is answered
    empty (its -1 dimensions 0)."""
