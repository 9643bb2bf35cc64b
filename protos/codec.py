"""The one numpy <-> Open Inference Protocol v2 tensor codec.

Tensors travel as raw little-endian bytes. Decoding checks the declared shape
against limits and against the byte count *before* allocating anything, so a
hostile shape cannot make a service allocate memory it was not sent.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from protos import pb, wire
from protos.errors import InvalidInput

# v2 datatype -> numpy dtype, explicitly little-endian.
DATATYPE_TO_DTYPE: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}

_KIND_SIZE_TO_DATATYPE: dict[tuple[str, int], str] = {
    (dt.kind, dt.itemsize): name for name, dt in DATATYPE_TO_DTYPE.items() if name != "BYTES"
}

# Which InferTensorContents field carries each datatype (FP16 has none: raw only).
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

_LEN_PREFIX = struct.Struct("<I")


@dataclass(frozen=True)
class TensorLimits:
    """Bounds checked before a tensor is materialised."""

    max_elements: int = 1 << 28
    """Most elements one tensor may declare (256 Mi)."""
    max_rank: int = 8
    """Most dimensions one tensor may declare."""
    max_inputs: int = 64
    """Most input tensors in one request."""


DEFAULT_LIMITS = TensorLimits()


def datatype_of(array: np.ndarray) -> str:
    """The v2 datatype name for a numpy array."""
    dt = array.dtype
    if dt.kind in ("O", "S", "U"):
        return "BYTES"
    try:
        return _KIND_SIZE_TO_DATATYPE[(dt.kind, dt.itemsize)]
    except KeyError:
        raise InvalidInput(f"numpy dtype {dt} has no v2 datatype") from None


def dtype_of(datatype: str, tensor: str = "tensor") -> np.dtype:
    """The numpy dtype for a v2 datatype name, or InvalidInput naming the tensor."""
    try:
        return DATATYPE_TO_DTYPE[datatype]
    except KeyError:
        raise InvalidInput(
            f"input '{tensor}': unknown datatype '{datatype}' "
            f"(expected one of {', '.join(DATATYPE_TO_DTYPE)})"
        ) from None


def checked_shape(
    shape: Sequence[int], tensor: str, limits: TensorLimits = DEFAULT_LIMITS
) -> tuple[tuple[int, ...], int]:
    """Validate a declared shape; return it as a tuple plus its element count."""
    dims = tuple(int(d) for d in shape)
    if len(dims) > limits.max_rank:
        raise InvalidInput(f"input '{tensor}': rank {len(dims)} exceeds {limits.max_rank}")
    if any(d < 0 for d in dims):
        raise InvalidInput(f"input '{tensor}': negative dimension in shape {list(dims)}")
    # Even with a zero elsewhere (no elements), no dimension may be larger than a tensor
    # may be: numpy refuses such shapes, and nothing real has them.
    if any(d > limits.max_elements for d in dims):
        big = max(dims)
        raise InvalidInput(
            f"input '{tensor}': dimension {big} is over the limit of {limits.max_elements}"
        )
    count = math.prod(dims)
    if count > limits.max_elements:
        raise InvalidInput(
            f"input '{tensor}': shape {list(dims)} has {count} elements, "
            f"more than the limit of {limits.max_elements}"
        )
    return dims, count


# ---------------------------------------------------------------- encoding


def encode_bytes_elements(elements: Iterable[object]) -> bytes:
    """BYTES elements as v2 raw contents: each one with a 4-byte LE length prefix."""
    parts: list[bytes] = []
    for item in elements:
        data = item.encode() if isinstance(item, str) else bytes(item)  # type: ignore[call-overload]
        parts.append(_LEN_PREFIX.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def to_raw_view(array: np.ndarray) -> tuple[str, bytes | memoryview]:
    """(datatype, raw little-endian bytes) for a numpy array: a view of the array's memory
    when no conversion is needed."""
    datatype = datatype_of(array)
    if datatype == "BYTES":
        return datatype, encode_bytes_elements(array.reshape(-1))
    le = np.ascontiguousarray(array, dtype=DATATYPE_TO_DTYPE[datatype])
    # reshape(-1) first: memoryview refuses to cast views with a zero in their shape.
    return datatype, memoryview(le.reshape(-1)).cast("B")


# ---------------------------------------------------------------- decoding


def decode_bytes_elements(raw: bytes | memoryview, count: int, tensor: str) -> np.ndarray:
    """Parse length-prefixed BYTES contents into a 1-D object array of `count` items."""
    view = memoryview(raw)
    if count * _LEN_PREFIX.size > len(view):
        # Checked before allocating: each element needs at least its prefix.
        raise InvalidInput(
            f"input '{tensor}': {len(view)} bytes cannot hold the {count} BYTES "
            f"elements its shape declares"
        )
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > len(view):
            raise InvalidInput(
                f"input '{tensor}': BYTES contents hold fewer than the {count} "
                f"elements its shape declares (ran out at element {i})"
            )
        (length,) = _LEN_PREFIX.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise InvalidInput(
                f"input '{tensor}': BYTES element {i} declares {length} bytes "
                f"but only {len(view) - offset} remain"
            )
        out[i] = bytes(view[offset : offset + length])
        offset += length
    if offset != len(view):
        raise InvalidInput(
            f"input '{tensor}': {len(view) - offset} bytes left over after the "
            f"{count} BYTES elements its shape declares"
        )
    return out


def from_raw(
    raw: bytes | memoryview,
    datatype: str,
    shape: Sequence[int],
    tensor: str = "tensor",
    limits: TensorLimits = DEFAULT_LIMITS,
) -> np.ndarray:
    """Decode raw v2 contents into a numpy array (zero-copy for numeric types)."""
    dtype = dtype_of(datatype, tensor)
    dims, count = checked_shape(shape, tensor, limits)
    if datatype == "BYTES":
        return decode_bytes_elements(raw, count, tensor).reshape(dims)
    expected = count * dtype.itemsize
    size = raw.nbytes if isinstance(raw, memoryview) else len(raw)
    if size != expected:
        raise InvalidInput(
            f"input '{tensor}': raw contents are {size} bytes, but shape "
            f"{list(dims)} of {datatype} needs {expected}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(dims)


def from_contents(
    contents: pb.InferTensorContents,
    datatype: str,
    shape: Sequence[int],
    tensor: str = "tensor",
    limits: TensorLimits = DEFAULT_LIMITS,
) -> np.ndarray:
    """Decode typed v2 contents into a numpy array."""
    dtype = dtype_of(datatype, tensor)
    dims, count = checked_shape(shape, tensor, limits)
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInput(f"input '{tensor}': {datatype} must be sent as raw contents")
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidInput(
            f"input '{tensor}': {field} holds {len(values)} values, but shape "
            f"{list(dims)} needs {count}"
        )
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        out[:] = list(values)
        return out.reshape(dims)
    if dtype.kind in "iu":
        # Typed fields are 32/64-bit wide: check the range before narrowing.
        wide = np.array(values, dtype=np.uint64 if datatype == "UINT64" else np.int64)
        info = np.iinfo(dtype)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise InvalidInput(f"input '{tensor}': a value does not fit {datatype}")
        return wide.astype(dtype).reshape(dims)
    return np.array(values, dtype=dtype).reshape(dims)


# ---------------------------------------------------------------- messages


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
    refs = [shared_ref(t.parameters, t.name) for t in request.inputs]
    n_plain = refs.count(None)
    n_raw = len(raw_contents)
    if n_raw and n_raw != n_plain:
        raise InvalidInput(
            f"request has {n_plain} inputs outside shared memory but {n_raw} "
            "raw_input_contents entries"
        )
    out: dict[str, np.ndarray] = {}
    next_raw = 0
    for tensor, ref in zip(request.inputs, refs, strict=True):
        if tensor.name in out:
            raise InvalidInput(f"input '{tensor.name}' appears twice")
        if ref is not None:
            if shared is None:
                raise InvalidInput(f"input '{tensor.name}': this server has no shared memory")
            data = shared(ref, tensor.name)
            arr = from_raw(data, tensor.datatype, tensor.shape, tensor.name, limits)
        elif n_raw:
            if tensor.HasField("contents"):
                raise InvalidInput(
                    f"input '{tensor.name}': both contents and raw_input_contents given"
                )
            raw = raw_contents[next_raw]
            next_raw += 1
            arr = from_raw(raw, tensor.datatype, tensor.shape, tensor.name, limits)
        else:
            arr = from_contents(tensor.contents, tensor.datatype, tensor.shape, tensor.name, limits)
        out[tensor.name] = arr
    return out


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
    carried = [(i, t) for i, t in enumerate(response.outputs) if SHM_REGION not in t.parameters]
    n_raw = len(raw_contents)
    aligned = n_raw == len(response.outputs) or [i for i, _ in carried] == list(range(n_raw))
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
) -> bytes:
    """The serialized ModelInferResponse, tensor bytes copied once (see protos.wire).
    `shared` outputs (already written to shared memory) are described after the others,
    with their region parameters and an empty raw entry each."""
    head = pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=request_id)
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
) -> bytes:
    """The serialized ModelInferRequest; tensors already little-endian are not re-encoded."""
    head = pb.ModelInferRequest(model_name=model_name, model_version=model_version, id=request_id)
    for name in outputs:
        head.outputs.add(name=name)
    return _with_raw_tensors(head, head.inputs, wire.RAW_INPUT_FIELD, inputs)
