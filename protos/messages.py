"""v2 inference messages <-> numpy tensors: ModelInferRequest / ModelInferResponse,
raw contents, typed contents and shared memory references. Each tensor goes through
the tensor codec (protos/codec.py); requests are encoded straight to bytes (protos/wire.py)
so that tensor bytes are copied once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError

from protos import pb, wire
from protos.codec import (
    DEFAULT_LIMITS,
    TensorLimits,
    datatype_of,
    from_contents,
    from_raw,
    to_raw_view,
)
from protos.errors import InvalidInput

SHM_REGION = "shared_memory_region"
SHM_BYTE_SIZE = "shared_memory_byte_size"
SHM_OFFSET = "shared_memory_offset"


@dataclass(frozen=True)
class SharedRef:
    """A tensor's place in a registered shared memory region (Triton's extension)."""

    region: str
    byte_size: int
    offset: int = 0


def shared_ref(parameters: Mapping[str, pb.InferParameter], tensor: str) -> SharedRef | None:
    """The tensor's shared memory parameters, when it has them."""
    if SHM_REGION not in parameters:
        return None
    region = parameters[SHM_REGION].string_param
    if not region or SHM_BYTE_SIZE not in parameters:
        raise InvalidInput(
            f"tensor '{tensor}': {SHM_REGION} needs a region name and {SHM_BYTE_SIZE}"
        )
    size = parameters[SHM_BYTE_SIZE]
    byte_size = size.int64_param or size.uint64_param
    offset = parameters[SHM_OFFSET].int64_param if SHM_OFFSET in parameters else 0
    if byte_size < 0 or offset < 0:
        raise InvalidInput(f"tensor '{tensor}': negative shared memory size or offset")
    return SharedRef(region, byte_size, offset)


SharedReader = Callable[[SharedRef, str], "bytes | memoryview"]


def request_inputs(
    parsed: wire.ParsedInferRequest,
    limits: TensorLimits = DEFAULT_LIMITS,
    shared: SharedReader | None = None,
) -> dict[str, np.ndarray]:
    """All input tensors of a received ModelInferRequest, by name (zero-copy views of the
    received buffer). Inputs in shared memory are read through `shared`; raw contents are
    given for the other inputs only, in order (as tritonclient sends them)."""
    if parsed.error:
        raise InvalidInput(f"request does not parse: {parsed.error}")
    raw_contents: Sequence[bytes | memoryview] = parsed.raw
    request = parsed.message
    n_inputs = len(request.inputs)
    if n_inputs > limits.max_inputs:
        raise InvalidInput(f"request has {n_inputs} inputs, more than {limits.max_inputs}")
    inputs = request.inputs[:]  # a list: iterated without an IndexError at its end
    refs = [shared_ref(t.parameters, t.name) for t in inputs]
    n_plain = refs.count(None)
    n_raw = len(raw_contents)
    if n_raw and n_raw != n_plain:
        raise InvalidInput(
            f"request has {n_plain} inputs outside shared memory but {n_raw} "
            "raw_input_contents entries"
        )
    out: dict[str, np.ndarray] = {}
    next_raw = 0
    typed = parsed.contents or [None] * n_inputs
    for tensor, ref, contents in zip(inputs, refs, typed, strict=True):
        if tensor.name in out:
            raise InvalidInput(f"input '{tensor.name}' appears twice")
        if ref is not None:
            if shared is None:
                raise InvalidInput(f"input '{tensor.name}': this server has no shared memory")
            data = shared(ref, tensor.name)
            arr = from_raw(data, tensor.datatype, tensor.shape, tensor.name, limits)
        elif n_raw:
            if contents is not None or tensor.HasField("contents"):
                raise InvalidInput(
                    f"input '{tensor.name}': both contents and raw_input_contents given"
                )
            raw = raw_contents[next_raw]
            next_raw += 1
            arr = from_raw(raw, tensor.datatype, tensor.shape, tensor.name, limits)
        else:
            values = tensor.contents if contents is None else _contents(contents, tensor.name)
            arr = from_contents(values, tensor.datatype, tensor.shape, tensor.name, limits)
        out[tensor.name] = arr
    return out


def _contents(serialized: bytes | memoryview, tensor: str) -> pb.InferTensorContents:
    try:
        return pb.InferTensorContents.FromString(serialized)
    except DecodeError:
        raise InvalidInput(f"input '{tensor}': its contents do not parse") from None


def response_outputs(
    response: pb.ModelInferResponse | wire.ParsedInferResponse,
    limits: TensorLimits = DEFAULT_LIMITS,
) -> dict[str, np.ndarray]:
    """All output tensors of a ModelInferResponse, by name (raw or typed contents)."""
    if isinstance(response, wire.ParsedInferResponse):
        raw_contents: Sequence[bytes | memoryview] = response.raw
        response = response.message
    else:
        raw_contents = response.raw_output_contents
    # Outputs written to shared memory carry no bytes here (the caller reads its region);
    # their raw entry is empty, or absent when a server lists them last without one.
    outputs = response.outputs[:]  # a list: iterated without an IndexError at its end
    n_raw = len(raw_contents)
    paired = n_raw == len(outputs)  # then only an output with an empty entry can be shared
    carried = [
        (i, t)
        for i, t in enumerate(outputs)
        if (paired and len(raw_contents[i])) or SHM_REGION not in t.parameters
    ]
    aligned = paired or [i for i, _ in carried] == list(range(n_raw))
    if n_raw and not aligned:
        raise InvalidInput(
            f"response has {len(response.outputs)} outputs but {n_raw} raw_output_contents"
        )
    out: dict[str, np.ndarray] = {}
    for i, tensor in carried:
        if n_raw:
            raw = raw_contents[i]
            out[tensor.name] = from_raw(raw, tensor.datatype, tensor.shape, tensor.name, limits)
        else:
            out[tensor.name] = from_contents(
                tensor.contents, tensor.datatype, tensor.shape, tensor.name, limits
            )
    return out


def build_request(
    model_name: str,
    inputs: Mapping[str, np.ndarray],
    *,
    model_version: str = "",
    request_id: str = "",
    outputs: Sequence[str] = (),
) -> pb.ModelInferRequest:
    """build_request_bytes as a protobuf message (for generated stubs and tools)."""
    return pb.ModelInferRequest.FromString(
        build_request_bytes(
            model_name,
            inputs,
            model_version=model_version,
            request_id=request_id,
            outputs=outputs,
        )
    )


def build_response_bytes(
    model_name: str,
    model_version: str,
    outputs: Mapping[str, np.ndarray],
    request_id: str = "",
    shared: Mapping[str, tuple[np.ndarray, SharedRef]] | None = None,
    parameters: Mapping[str, str | int | bool] | None = None,
) -> bytes:
    """The serialized ModelInferResponse, tensor bytes copied once (see protos.wire).
    `shared` outputs (already written to shared memory) are described after the others,
    with their region parameters and an empty raw entry each; `parameters`: the response's."""
    head = pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=request_id)
    for key, value in (parameters or {}).items():
        set_parameter(head.parameters[key], value)
    return _with_raw_tensors(head, head.outputs, wire.RAW_OUTPUT_FIELD, outputs, shared)


def _with_raw_tensors(
    head,
    tensors,
    field: int,
    arrays: Mapping[str, np.ndarray],
    shared: Mapping[str, tuple[np.ndarray, SharedRef]] | None = None,
) -> bytes:
    """Describe `arrays` in the `tensors` list of `head`, append their bytes as `field`.

    Each shared memory output gets an empty raw entry: Triton's C++ client (perf_analyzer)
    reads raw_output_contents[i] for every output i without a bounds check."""
    views = []
    for name, array in arrays.items():
        datatype, view = to_raw_view(np.asarray(array))
        tensors.add(name=name, datatype=datatype, shape=array.shape)
        views.append(view)
    for name, (array, ref) in (shared or {}).items():
        tensor = tensors.add(name=name, datatype=datatype_of(array), shape=array.shape)
        tensor.parameters[SHM_REGION].string_param = ref.region
        tensor.parameters[SHM_BYTE_SIZE].int64_param = ref.byte_size
        if ref.offset:
            tensor.parameters[SHM_OFFSET].int64_param = ref.offset
        views.append(b"")
    return wire.with_field(head, field, views)


def build_request_bytes(
    model_name: str,
    inputs: Mapping[str, np.ndarray],
    *,
    model_version: str = "",
    request_id: str = "",
    outputs: Sequence[str] = (),
    timeout_us: int = 0,
    classification: Mapping[str, int] | None = None,
    traceparent: str | None = None,
) -> bytes:
    """The serialized ModelInferRequest; tensors already little-endian are not re-encoded.
    `timeout_us` > 0: Triton's `timeout` parameter (the request's own deadline);
    `classification`: output -> k, those outputs asked as their top k (Triton's extension);
    `traceparent`: a streamed request's trace context (protos/tracing.py)."""
    head = pb.ModelInferRequest(model_name=model_name, model_version=model_version, id=request_id)
    for name in outputs:
        asked = head.outputs.add(name=name)
        if classification and classification.get(name, 0) > 0:
            asked.parameters["classification"].int64_param = classification[name]
    if timeout_us > 0:
        head.parameters["timeout"].int64_param = timeout_us
    if traceparent:
        head.parameters["traceparent"].string_param = traceparent
    return _with_raw_tensors(head, head.inputs, wire.RAW_INPUT_FIELD, inputs)


def set_parameter(param: pb.InferParameter, value: str | int | bool) -> None:
    """One v2 parameter from a Python value."""
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    else:
        param.string_param = str(value)
