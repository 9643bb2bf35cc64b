"""A cache entry: named tensors (and a parallel step's per-branch tensors) as bytes, the same
in process and in Redis. No pickle: an entry read from a shared Redis is data, never code.

Layout: a 4-byte little-endian header length, the JSON header (each tensor's name,
datatype, shape and byte count, in order), then each tensor's raw v2 contents.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import orjson

from protos import codec
from protos.errors import InvalidInput

_LENGTH = struct.Struct("<I")

Tensors = dict[str, np.ndarray]


@dataclass
class Stored:
    tensors: Tensors
    branches: dict[str, dict[str, Tensors]] = field(default_factory=dict)
    """Parallel step -> branch -> its outputs (what `per_branch` results read)."""


def pack(entry: Stored) -> bytes:
    described: list[list] = []
    parts: list[bytes | memoryview] = []

    def add(where: list[str], name: str, array: np.ndarray) -> None:
        datatype, raw = codec.to_raw_view(array)
        described.append([where, name, datatype, list(array.shape), len(raw)])
        parts.append(raw)

    for name, array in entry.tensors.items():
        add([], name, array)
    for step, branches in entry.branches.items():
        for branch, outputs in branches.items():
            for name, array in outputs.items():
                add([step, branch], name, array)
    header = orjson.dumps(described)
    return b"".join([_LENGTH.pack(len(header)), header, *parts])


def unpack(blob: bytes) -> Stored:
    """The entry in `blob`; ValueError when it is not one (a foreign or damaged value)."""
    try:
        (length,) = _LENGTH.unpack_from(blob)
        described = orjson.loads(blob[_LENGTH.size : _LENGTH.size + length])
        offset = _LENGTH.size + length
        entry = Stored({})
        for where, name, datatype, shape, size in described:
            array = codec.from_raw(blob[offset : offset + size], datatype, shape, name)
            offset += size
            if where:
                step, branch = where
                entry.branches.setdefault(step, {}).setdefault(branch, {})[name] = array
            else:
                entry.tensors[name] = array
    except (struct.error, orjson.JSONDecodeError, ValueError, TypeError, InvalidInput) as exc:
        raise ValueError(f"not a cache entry: {exc}") from None
    if offset != len(blob):
        raise ValueError("not a cache entry: trailing bytes")
    return entry
