"""Triton's system shared memory extension: regions a same-host client registers, so that
tensors go through a POSIX shared memory object instead of the gRPC message.

A region maps `byte_size` bytes at `offset` of the object named `key` (shm_open's name,
i.e. a file in /dev/shm). Inputs are read in place (zero-copy); outputs are written there.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from protos.errors import AlreadyExists, InvalidInput, NotFound, Unsupported
from protos.messages import SharedRef

SHM_DIR = Path("/dev/shm")
_KEY = re.compile(r"/?[A-Za-z0-9_.\-]{1,200}")


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    _map: mmap.mmap = field(repr=False)

    def view(self, ref: SharedRef, tensor: str) -> memoryview:
        if ref.offset + ref.byte_size > self.byte_size:
            raise InvalidInput(
                f"tensor '{tensor}': {ref.byte_size} bytes at offset {ref.offset} overrun "
                f"shared memory region '{self.name}' of {self.byte_size} bytes"
            )
        start = self.offset + ref.offset
        return memoryview(self._map)[start : start + ref.byte_size]

    def close(self) -> None:
        # A request still reading it keeps it open: the map closes with its last view.
        with contextlib.suppress(BufferError):
            self._map.close()


class SharedMemory:
    """The registered regions of one server."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not self.enabled:
            raise Unsupported("shared memory is turned off on this server (--shared-memory)")
        if not name:
            raise InvalidInput("shared memory region needs a name")
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' is already registered")
        if not _KEY.fullmatch(key) or key.strip("/") in (".", ".."):
            raise InvalidInput(f"shared memory key {key!r} is not a shared memory object name")
        path = SHM_DIR / key.lstrip("/")
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise InvalidInput(f"shared memory key {key!r}: {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if byte_size <= 0 or offset + byte_size > size:
                raise InvalidInput(
                    f"shared memory region '{name}': {byte_size} bytes at offset {offset} do not "
                    f"fit in {key!r} ({size} bytes)"
                )
            mapped = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._regions[name] = Region(name, key, offset, byte_size, mapped)

    def unregister(self, name: str) -> None:
        """Forget one region (no error when unknown, like Triton) or, for "", every one."""
        names = list(self._regions) if not name else [name]
        for one in names:
            region = self._regions.pop(one, None)
            if region is not None:
                region.close()

    def status(self, name: str) -> list[Region]:
        if not name:
            return list(self._regions.values())
        if name not in self._regions:
            raise NotFound(f"shared memory region '{name}' is not registered")
        return [self._regions[name]]

    def read(self, ref: SharedRef, tensor: str) -> memoryview:
        return self._region(ref, tensor).view(ref, tensor)

    def write(self, ref: SharedRef, tensor: str, data: bytes | memoryview) -> None:
        view = self._region(ref, tensor).view(ref, tensor)
        if len(data) > len(view):
            raise InvalidInput(
                f"output '{tensor}' needs {len(data)} bytes; shared memory region "
                f"'{ref.region}' was given {len(view)}"
            )
        view[: len(data)] = data

    def _region(self, ref: SharedRef, tensor: str) -> Region:
        region = self._regions.get(ref.region)
        if region is None:
            raise InvalidInput(
                f"tensor '{tensor}': shared memory region '{ref.region}' is not registered"
            )
        return region

    def close(self) -> None:
        self.unregister("")
