"""What a failing request leaves behind. A serving process's collector rarely makes a full
pass (protos/heap.py), so whatever a failure leaves in a reference cycle stays: its upload
must be freed with its error by reference counting alone."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager


class Upload:
    """Stands for a request's upload, held by the frames its error passes through."""


class Uploads:
    """Uploads made by failing work, watched through weak references."""

    def __init__(self) -> None:
        self._refs: list[weakref.ref[Upload]] = []

    def new(self) -> Upload:
        """One for a frame to hold (keep it in a local of the failing work)."""
        upload = Upload()
        self._refs.append(weakref.ref(upload))
        return upload

    def alive(self) -> int:
        return sum(ref() is not None for ref in self._refs)


@contextmanager
def collector_off() -> Iterator[None]:
    """No collection meanwhile: what is freed is freed by reference counting."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
