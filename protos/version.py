"""The project's version, read once from the installed distribution (pyproject.toml), and
digests of the source that decides answers."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path


def _installed() -> str:
    try:
        return metadata.version("inference-mesh")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


VERSION = _installed()


def code_digest(sources: tuple[Path, ...]) -> str:
    """Source files, digested. The package's version stays 0.1.0 from commit to commit, so
    what keys answers by their code (a recipe's digest, the proxy's cache keys) covers the
    source itself: an upgrade that answers differently never reads entries the old code made
    (a Redis cache outlives the processes, and is shared by old and new during a rollout)."""
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
