"""v2 REST inference requests (JSON tensors) checked whole before anything is allocated,
and their answers.

Besides JSON data, tensors may travel in Triton's binary tensor extension (the JSON header,
`Inference-Header-Content-Length` bytes long, then each tensor's raw bytes, sized by its
`binary_data_size` parameter: what tritonclient's HTTP client sends and asks for), and
BYTES elements as base64 text (`"parameters": {"content_type": "base64"}`), for images.

Every field is checked for its JSON type, every shape against the codec's limits, every
element against its datatype, and the bytes a request would make against the body limit,
so a malformed or hostile request is a 400 naming the field, never a 500 and never a
large allocation (an 88-byte body with an integer as a BYTES element used to make the
proxy allocate 1.5 GB of zeros).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from protos import codec
from protos.errors import InvalidInput
from v2server.model import TensorSpec
from v2server.validation import check_declared

MAX_NAME = 256
"""Longest tensor name accepted."""

Expected = tuple[str, Sequence[TensorSpec], int]
"""A model's name, its declared inputs and its max_batch_size (0: none)."""

_NUMBER_KINDS = {"i": (int,), "u": (int,), "f": (int, float), "b": (bool,)}


@dataclass
class InferRequest:
    inputs: dict[str, np.ndarray]
    outputs: list[str] = field(default_factory=list)
    id: str | None = None
    timeout_s: float | None = None
    """Triton's `timeout` request parameter (given in microseconds)."""
    binary_outputs: set[str] | None = field(default_factory=set)
    """Outputs to answer in the binary extension; None: all of them."""
    classification: dict[str, int] = field(default_factory=dict)
    """Outputs asked as their top k."""


def parse(
    raw: bytes,
    max_bytes: int,
    limits: codec.TensorLimits = codec.DEFAULT_LIMITS,
    header_length: int | None = None,
    expected: Expected | None = None,
) -> InferRequest:
    """The request in `raw` (its first `header_length` bytes, the rest binary tensors, when
    given); InvalidInput naming the first thing wrong with it. With `expected` (the model's
    name and declared inputs), each input's name, datatype and shape are checked against
    them before its data is decoded."""
    binary = memoryview(b"")
    if header_length is not None:
        if not 0 < header_length <= len(raw):
            raise InvalidInput(
                f"Inference-Header-Content-Length {header_length} does not fit a body of "
                f"{len(raw)} bytes"
            )
        binary = memoryview(raw)[header_length:]
        raw = raw[:header_length]
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
    offset = 0
    for i, spec in enumerate(inputs):
        name, array, offset = _tensor(
            spec, f"inputs[{i}]", limits, budget, binary, offset, expected
        )
        if name in tensors:
            raise InvalidInput(f"inputs[{i}]: a second input named '{name}'")
        tensors[name] = array
    if offset != len(binary):
        raise InvalidInput(
            f"{len(binary) - offset} bytes after the header belong to no input's binary_data_size"
        )
    parameters = _parameters(body.get("parameters"), "'parameters'")
    outputs, binary_outputs, classes = _outputs(body.get("outputs"))
    if parameters.get("binary_data_output") is True:
        binary_outputs = None
    return InferRequest(
        tensors, outputs, _id(body.get("id")), _timeout(parameters), binary_outputs, classes
    )


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} must be an object")
    return value


def _timeout(parameters: dict[str, Any]) -> float | None:
    value = parameters.get("timeout")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidInput("parameter 'timeout' must be a positive integer (microseconds)")
    return value / 1e6


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{where}: 'name' must be a non-empty string")
    if len(value) > MAX_NAME:
        raise InvalidInput(f"{where}: 'name' is longer than {MAX_NAME} characters")
    return value


def _outputs(value: Any) -> tuple[list[str], set[str], dict[str, int]]:
    """The names asked for, those of them asked for in binary, and those asked as their
    top k (Triton's classification extension: `"parameters": {"classification": k}`)."""
    if value is None:
        return [], set(), {}
    if not isinstance(value, list):
        raise InvalidInput("'outputs' must be a list of {\"name\": ...} objects")
    names, binary, classes = [], set(), {}
    for i, spec in enumerate(value):
        if not isinstance(spec, dict):
            raise InvalidInput(f"outputs[{i}] must be an object with a 'name'")
        name = _name(spec.get("name"), f"outputs[{i}]")
        names.append(name)
        parameters = _parameters(spec.get("parameters"), f"outputs[{i}].parameters")
        if parameters.get("binary_data"):
            binary.add(name)
        k = parameters.get("classification")
        if k is not None:
            if not isinstance(k, int) or isinstance(k, bool) or k < 0:
                raise InvalidInput(
                    f"outputs[{i}].parameters.classification must be a non-negative integer"
                )
            if k:
                classes[name] = k
    return names, binary, classes


def _id(value: Any) -> str | None:
    """Echoed as given (it never travels downstream), so any string will do."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput("'id' must be a string")
    return value


def _tensor(
    spec: Any,
    where: str,
    limits: codec.TensorLimits,
    budget: list[int],
    binary: memoryview,
    offset: int,
    expected: Expected | None = None,
) -> tuple[str, np.ndarray, int]:
    """One input, and where the next one's binary data starts."""
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
    if expected is not None:
        model, specs, max_batch = expected
        check_declared(model, specs, [(name, datatype, dims)], max_batch, complete=False)
    parameters = _parameters(spec.get("parameters"), f"{where}: 'parameters'")
    size = parameters.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(f"{where}: 'binary_data_size' must be a non-negative integer")
        if offset + size > len(binary):
            raise InvalidInput(f"{where}: binary_data_size {size} runs past the end of the body")
        array = codec.from_raw(binary[offset : offset + size], datatype, dims, name, limits)
        return name, array, offset + size
    if "data" not in spec:
        raise InvalidInput(f"{where}: 'data' is missing")
    flat = _flatten(spec["data"], count, where)
    if len(flat) != count:
        raise InvalidInput(f"{where}: {len(flat)} values do not fill shape {list(dims)}")
    dtype = codec.DATATYPE_TO_DTYPE[datatype]
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise InvalidInput(f"{where}: BYTES elements must be strings")
        if parameters.get("content_type") == "base64":
            try:
                elements = [base64.b64decode(v, validate=True) for v in flat]
            except (binascii.Error, ValueError):
                raise InvalidInput(f"{where}: an element is not base64") from None
        else:
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
            with np.errstate(over="ignore"):
                array = np.array(flat, dtype=dtype)
        except OverflowError:
            raise InvalidInput(f"{where}: a value does not fit {datatype}") from None
        # JSON has no infinity: one here is a number too large for the type (1e39 as FP32).
        if dtype.kind == "f" and count and not np.isfinite(array).all():
            raise InvalidInput(f"{where}: a value does not fit {datatype}")
    return name, array.reshape(dims), offset


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
