"""v2 REST inference requests (JSON tensors) checked whole before anything is allocated.

Every field is checked for its JSON type, every shape against the codec's limits, every
element against its datatype, and the bytes a request would make against the body limit,
so a malformed or hostile request is a 400 naming the field, never a 500 and never a
large allocation (an 88-byte body with an integer as a BYTES element used to make the
proxy allocate 1.5 GB of zeros).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from protos import codec
from protos.errors import InvalidInput

MAX_NAME = 256
"""Longest tensor name accepted."""

_NUMBER_KINDS = {"i": (int,), "u": (int,), "f": (int, float), "b": (bool,)}


@dataclass
class InferRequest:
    inputs: dict[str, np.ndarray]
    outputs: list[str] = field(default_factory=list)
    id: str | None = None


def parse(
    raw: bytes, max_bytes: int, limits: codec.TensorLimits = codec.DEFAULT_LIMITS
) -> InferRequest:
    """The request in `raw`; InvalidInput naming the first thing wrong with it."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidInput("body must be a JSON object with an 'inputs' list")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    if len(inputs) > limits.max_inputs:
        raise InvalidInput(f"{len(inputs)} inputs, more than the limit of {limits.max_inputs}")
    budget = [max_bytes]  # what the decoded tensors may add up to
    tensors: dict[str, np.ndarray] = {}
    for i, spec in enumerate(inputs):
        name, array = _tensor(spec, f"inputs[{i}]", limits, budget)
        if name in tensors:
            raise InvalidInput(f"inputs[{i}]: a second input named '{name}'")
        tensors[name] = array
    return InferRequest(tensors, _outputs(body.get("outputs")), _id(body.get("id")))


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{where}: 'name' must be a non-empty string")
    if len(value) > MAX_NAME:
        raise InvalidInput(f"{where}: 'name' is longer than {MAX_NAME} characters")
    return value


def _outputs(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput("'outputs' must be a list of {\"name\": ...} objects")
    names = []
    for i, spec in enumerate(value):
        if not isinstance(spec, dict):
            raise InvalidInput(f"outputs[{i}] must be an object with a 'name'")
        names.append(_name(spec.get("name"), f"outputs[{i}]"))
    return names


def _id(value: Any) -> str | None:
    """Echoed as given (it never travels downstream), so any string will do."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput("'id' must be a string")
    return value


def _tensor(
    spec: Any, where: str, limits: codec.TensorLimits, budget: list[int]
) -> tuple[str, np.ndarray]:
    if not isinstance(spec, dict):
        raise InvalidInput(f"{where} must be an object with name, shape, datatype and data")
    name = _name(spec.get("name"), where)
    where = f"input '{name}'"
    datatype = spec.get("datatype")
    if not isinstance(datatype, str) or datatype not in codec.DATATYPE_TO_DTYPE:
        raise InvalidInput(
            f"{where}: 'datatype' must be one of {', '.join(codec.DATATYPE_TO_DTYPE)}"
        )
    if datatype == "FP16":
        raise InvalidInput(f"{where}: FP16 cannot travel as JSON numbers; use FP32")
    shape = spec.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) > limits.max_rank
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise InvalidInput(
            f"{where}: 'shape' must be a list of at most {limits.max_rank} non-negative integers"
        )
    dims, count = codec.checked_shape(shape, name, limits)
    if "data" not in spec:
        raise InvalidInput(f"{where}: 'data' is missing")
    flat = _flatten(spec["data"], count, where)
    if len(flat) != count:
        raise InvalidInput(f"{where}: {len(flat)} values do not fill shape {list(dims)}")
    dtype = codec.DATATYPE_TO_DTYPE[datatype]
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise InvalidInput(f"{where}: BYTES elements must be strings")
        elements = [v.encode() for v in flat]
        size = sum(len(e) for e in elements)
    else:
        kinds = _NUMBER_KINDS[dtype.kind]
        if not all(
            isinstance(v, kinds) and (dtype.kind == "b" or not isinstance(v, bool)) for v in flat
        ):
            raise InvalidInput(
                f"{where}: {datatype} elements must be JSON {_kind_name(dtype.kind)}"
            )
        size = count * dtype.itemsize
    budget[0] -= size
    if budget[0] < 0:
        raise InvalidInput(f"{where}: the tensors would take more than the body limit")
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = elements
    else:
        try:
            array = np.array(flat, dtype=dtype)
        except OverflowError:
            raise InvalidInput(f"{where}: a value does not fit {datatype}") from None
    return name, array.reshape(dims)


def _kind_name(kind: str) -> str:
    return {"i": "integers", "u": "integers", "f": "numbers", "b": "booleans"}[kind]


def _flatten(data: Any, most: int, where: str) -> list[Any]:
    """Nested lists flattened in row-major order; more than `most` values stop early."""
    if not isinstance(data, list):
        raise InvalidInput(f"{where}: 'data' must be a list")
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) > 32:
                    raise InvalidInput(f"{where}: 'data' is nested too deeply")
                stack.append(iter(item))
                break
            if isinstance(item, dict) or item is None:
                raise InvalidInput(f"{where}: 'data' holds a {type(item).__name__}")
            out.append(item)
            if len(out) > most:
                raise InvalidInput(f"{where}: more values in 'data' than the shape holds")
        else:
            stack.pop()
    return out
