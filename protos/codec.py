"""The one numpy <-> Open Inference Protocol v2 tensor codec (whole messages:
protos/messages.py).

Tensors travel as raw little-endian bytes. Decoding checks the declared shape
against limits and against the byte count *before* allocating anything, so a
hostile shape cannot make a service allocate memory it was not sent.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from protos import pb
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

CONFIG_DATA_TYPE: dict[str, int] = {
    name: pb.DataType.Value("TYPE_STRING" if name == "BYTES" else f"TYPE_{name}")
    for name in DATATYPE_TO_DTYPE
}
"""v2 datatype -> the DataType of Triton's model configuration (config.pbtxt, ModelConfig)."""

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
length_prefix = _LEN_PREFIX.pack
"""A BYTES element's 4-byte little-endian length prefix, as v2 raw contents frame it."""


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
    # Built-ins over the whole tuple, no generators: every tensor of every call comes here.
    # Sliced first: a protobuf repeated field (and a numpy array) iterates by index until an
    # IndexError, whose message alone costs more than the rest of this check; a slice of
    # one is a list, of a tuple the tuple itself.
    dims = tuple(map(int, shape[:]))
    if len(dims) > limits.max_rank:
        raise InvalidInput(f"input '{tensor}': rank {len(dims)} exceeds {limits.max_rank}")
    if dims and min(dims) < 0:
        raise InvalidInput(f"input '{tensor}': negative dimension in shape {list(dims)}")
    count = math.prod(dims)
    if count == 0 and dims:
        # Even with a zero elsewhere (no elements), the other dimensions together may not be
        # larger than a tensor may be: numpy refuses such shapes (a [0, 2e4, 1e7, 1e7] one
        # was an INTERNAL error), and nothing real has them.
        spanned = math.prod(d for d in dims if d)
        if spanned > limits.max_elements:
            raise InvalidInput(
                f"input '{tensor}': shape {list(dims)} spans {spanned} elements without its "
                f"zero dimensions, over the limit of {limits.max_elements}"
            )
    if count > limits.max_elements:
        raise InvalidInput(
            f"input '{tensor}': shape {list(dims)} has {count} elements, "
            f"more than the limit of {limits.max_elements}"
        )
    return dims, count


def content_bytes(array: np.ndarray, per_element: int = 0) -> int:
    """The bytes a tensor's contents take: its buffer, or for BYTES each element's own
    length plus `per_element` (4 on the wire: its length prefix; 8 for a non-bytes one)."""
    if array.dtype == object:
        # Over a list: an array's iteration ends in an IndexError, formatted each time.
        elements = array.reshape(-1).tolist()
        return sum(len(v) + per_element if isinstance(v, bytes | str) else 8 for v in elements)
    return array.nbytes


# ---------------------------------------------------------------- encoding


def bytes_element_parts(elements: Iterable[object]) -> list[bytes]:
    """BYTES elements as the pieces of their v2 raw contents: each one's 4-byte LE length
    prefix, then its bytes (a `bytes` element itself, not a copy)."""
    parts: list[bytes] = []
    if isinstance(elements, np.ndarray):
        # A list, not the array: iterating an array ends in an IndexError, its message
        # formatted each time (~5,000 instructions: a request's BYTES input costs more).
        elements = elements.reshape(-1).tolist()
    for item in elements:
        data = item.encode() if isinstance(item, str) else bytes(item)  # type: ignore[call-overload]
        parts.append(_LEN_PREFIX.pack(len(data)))
        parts.append(data)
    return parts


def encode_bytes_elements(elements: Iterable[object]) -> bytes:
    """BYTES elements as v2 raw contents: each one with a 4-byte LE length prefix."""
    return b"".join(bytes_element_parts(elements))


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
