"""Small disks for the tests of what a full one does: a tmpfs of a given size, mounted for
the test and unmounted after (root only: CI runs as root and must run these tests), grown
in place, or filled by another writer."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (root only)."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI must run the full-disk tests: they mount a tmpfs (root)")
        pytest.skip("needs root to mount a tmpfs")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def grow(path: Path, size: str) -> None:
    """The small disk at `path` given room: `size` in all."""
    subprocess.run(["mount", "-o", f"remount,size={size}", "tmpfs", str(path)], check=True)


def fill(path: Path) -> None:
    """Write `path` until its disk has no room left."""
    with path.open("wb") as filler, contextlib.suppress(OSError):
        while True:
            filler.write(bytes(1 << 16))
            filler.flush()
