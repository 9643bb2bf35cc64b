"""The project's version, read once from the installed distribution (pyproject.toml)."""

from __future__ import annotations

from importlib import metadata


def _installed() -> str:
    try:
        return metadata.version("inference-mesh")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


VERSION = _installed()
