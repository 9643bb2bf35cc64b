"""A cache entry: named tensors (and a parallel step's per-branch tensors).

- In Redis, as bytes (`pack`, `unpack`). No pickle: an entry read from a shared Redis is
  data, never code. Layout: a 4-byte little-endian header length, the JSON header (each
  tensor's name, datatype, shape and byte count, in order), then each tensor's raw v2
  contents.
- In process, as one tuple of a shared layout (the tensors' names) and read-only copies of
  the arrays (`keep`, `kept`): no serialising on a miss and no parsing on a hit, and nothing
  the garbage collector keeps walking (a pass stops tracking a tuple that holds only
  strings, arrays and untracked tuples; numpy arrays are never tracked).
  Thousands of entries as dicts and dataclasses stalled its full passes (p99 198 ms at
  c=32); packing every entry into bytes instead cost ~30 us a miss and more a hit.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
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

    def places(self) -> Iterator[tuple[str, str, str, np.ndarray]]:
        """Every tensor as (step, branch, name, array): step and branch '' for the answer's
        own tensors, then each parallel step's branches' outputs."""
        for name, array in self.tensors.items():
            yield "", "", name, array
        for step, branches in self.branches.items():
            for branch, outputs in branches.items():
                for name, array in outputs.items():
                    yield step, branch, name, array

    def place(self, step: str, branch: str, name: str, array: np.ndarray) -> None:
        """`places`' inverse, one tensor at a time."""
        if step:
            self.branches.setdefault(step, {}).setdefault(branch, {})[name] = array
        else:
            self.tensors[name] = array


def pack(entry: Stored) -> bytes:
    described: list[list] = []
    parts: list[bytes | memoryview] = []
    for step, branch, name, array in entry.places():
        datatype, raw = codec.to_raw_view(array)
        where = [step, branch] if step else []
        described.append([where, name, datatype, list(array.shape), len(raw)])
        parts.append(raw)
    header = orjson.dumps(described)
    return b"".join([_LENGTH.pack(len(header)), header, *parts])


Kept = tuple
"""An entry kept in process: one tuple, its layout first (each tensor's step, branch and
name in turn, flat; '' for the answer's own tensors), then the arrays in the same order. One
tuple, not one per tensor: every tuple made is counted toward the garbage collector's next
young pass until a pass stops tracking it, and an entry is made on every miss (a `digits`
answer kept as nested tuples made 13; its young passes cost 2-5x the cache off's, measured
over one mesh). A flat layout of strings: a pass stops tracking it at once, and so the
entries holding it (a layout of tuples was still tracked after its first pass, and with it
every entry made until a full pass: 41,000 of 50,000)."""

KEPT_OVERHEAD = 128
"""Bytes counted for each kept array beyond its contents (its header and its names)."""

_layouts: dict[tuple[str, ...], tuple[str, ...]] = {}
"""Every layout seen, kept once: the entries of a pipeline or a step share one."""
_MAX_LAYOUTS = 4096
"""Beyond this many (a pipeline whose tensors' names vary without end), layouts are not
shared, only kept by their entries."""


def keep(entry: Stored) -> tuple[Kept, int]:
    """The entry as the in-process store keeps it, and the bytes it counts for. The arrays
    are copied (a view would pin the buffer it was cut from: a merged call's whole answer)
    and read-only (an entry answers many requests at once)."""
    places: list[str] = []
    arrays: list[np.ndarray] = []
    size = 0
    for step, branch, name, array in entry.places():
        copy = array.copy()  # C order
        # write=False, positional: ~1/3 of the keyword form's cost, ~1/5 of flags.writeable's.
        copy.setflags(False)
        places += (step, branch, name)
        arrays.append(copy)
        size += copy.nbytes + KEPT_OVERHEAD
    layout = tuple(places)
    shared = _layouts.get(layout)
    if shared is None:
        shared = layout
        if len(_layouts) < _MAX_LAYOUTS:
            _layouts[layout] = layout
    return (shared, *arrays), size


def kept(entry: Kept) -> Stored:
    """A kept entry as a Stored one (new mappings over the shared, read-only arrays)."""
    out = Stored({})
    layout = entry[0]
    for i in range(0, len(layout), 3):
        out.place(layout[i], layout[i + 1], layout[i + 2], entry[i // 3 + 1])
    return out


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
            step, branch = where or ("", "")
            entry.place(step, branch, name, array)
    except (struct.error, orjson.JSONDecodeError, ValueError, TypeError, InvalidInput) as exc:
        raise ValueError(f"not a cache entry: {exc}") from None
    if offset != len(blob):
        raise ValueError("not a cache entry: trailing bytes")
    return entry
