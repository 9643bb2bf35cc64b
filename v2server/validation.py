"""Checks of request tensors against a model's declared inputs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from protos.codec import datatype_of
from protos.errors import InvalidInput
from v2server.model import TensorSpec


def check_inputs(model: str, specs: Sequence[TensorSpec], inputs: Mapping[str, np.ndarray]) -> None:
    """Raise InvalidInput naming the tensor, what was expected and what came."""
    check_declared(model, specs, [(name, datatype_of(a), a.shape) for name, a in inputs.items()])


def check_declared(
    model: str,
    specs: Sequence[TensorSpec],
    declared: Sequence[tuple[str, str, Sequence[int]]],
    max_batch: int = 0,
    *,
    complete: bool = True,
) -> None:
    """check_inputs on what a request declares of each input (name, datatype, shape), before
    a byte of it is decoded: a request whose shape the model refuses costs nothing (a door
    once decoded 16 M BYTES elements of a `[1]` input, element by element, before saying no).
    `max_batch` > 0: the first dimension of each input may not exceed it (max_batch_size).
    `complete=False`: `declared` is some of the inputs (one checked as it is read)."""
    by_name = {s.name: s for s in specs}
    given = {name: (datatype, shape) for name, datatype, shape in declared}
    for name in given:
        if name not in by_name:
            raise InvalidInput(
                f"model '{model}' has no input '{name}' "
                f"(expected {', '.join(sorted(by_name)) or 'none'})"
            )
    for spec in specs:
        if spec.name not in given:
            if spec.optional or not complete:
                continue
            raise InvalidInput(f"model '{model}': missing input '{spec.name}'")
        actual, shape = given[spec.name]
        if actual != spec.datatype:
            raise InvalidInput(
                f"model '{model}' input '{spec.name}': expected datatype "
                f"{spec.datatype}, got {actual}"
            )
        if not shape_matches(spec.shape, shape):
            raise InvalidInput(
                f"model '{model}' input '{spec.name}': expected shape "
                f"{list(spec.shape)}, got {list(shape)}"
            )
        if spec.max_shape or spec.multiple_of or spec.max_elements:
            check_bounds(model, spec, shape)
        if max_batch and len(shape) and shape[0] > max_batch:
            raise InvalidInput(
                f"model '{model}' input '{spec.name}': batch of {shape[0]} rows exceeds "
                f"max_batch_size {max_batch}"
            )


def check_bounds(model: str, spec: TensorSpec, shape: Sequence[int]) -> None:
    """An input's dimensions against its declared largest sizes and multiples."""
    where = f"model '{model}' input '{spec.name}'"
    for axis, (size, most) in enumerate(zip(shape, spec.max_shape, strict=False)):
        if most >= 0 and size > most:
            raise InvalidInput(
                f"{where}: dimension {axis} is {size}, more than the model takes "
                f"({most}; largest shape {list(spec.max_shape)})"
            )
    if spec.max_elements and math.prod(shape) > spec.max_elements:
        raise InvalidInput(
            f"{where}: shape {list(shape)} is {math.prod(shape):,} elements, more than the "
            f"model takes ({spec.max_elements:,})"
        )
    for axis, (size, step) in enumerate(zip(shape, spec.multiple_of, strict=False)):
        if step > 1 and size % step:
            raise InvalidInput(
                f"{where}: dimension {axis} is {size}, not a multiple of {step} "
                f"(the model takes multiples of {list(spec.multiple_of)})"
            )


def shape_matches(expected: Sequence[int], actual: Sequence[int]) -> bool:
    """True when ranks agree and every fixed dimension matches (-1 matches anything)."""
    return len(expected) == len(actual) and all(
        e == -1 or e == a for e, a in zip(expected, actual, strict=True)
    )


def batch_rows(model: str, inputs: Mapping[str, np.ndarray]) -> int:
    """The shared first dimension of all inputs (the batch size)."""
    rows = {name: arr.shape[0] if arr.ndim else -1 for name, arr in inputs.items()}
    distinct = set(rows.values())
    if -1 in distinct:
        raise InvalidInput(f"model '{model}': batched inputs need a batch dimension")
    if len(distinct) > 1:
        raise InvalidInput(f"model '{model}': inputs disagree on batch size: {rows}")
    return distinct.pop() if distinct else 0
