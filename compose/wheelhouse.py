"""Fill compose/wheels with the image's dependencies: `python -m compose.wheelhouse`.

`--requirements` only prints them (the Dockerfile installs from that list), so that
pyproject.toml is read in one place.

For building the image where no package index is reachable: the wheels of the runtime
dependencies in pyproject.toml, pinned by constraints.txt, plus setuptools (to build the
mesh's own package), installed in the image with
`--build-arg "PIP_ARGS=--no-index --find-links /app/compose/wheels"`.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / "compose" / "wheels"
IMAGE_ONLY = ["async-timeout"]
"""Dependencies that only the image's older interpreter asks for."""


def requirements() -> list[str]:
    """The runtime dependencies declared in pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def _stamp(python: str) -> str:
    """What the wheelhouse is made from: while it stays the same, pip's ~10 s of resolving
    would find every wheel present."""
    made_from = [*requirements(), *IMAGE_ONLY, python, (ROOT / "constraints.txt").read_text()]
    return hashlib.sha256("\n".join(made_from).encode()).hexdigest()


def build(python: str = sys.executable, out: Path = WHEELS) -> Path:
    stamp, want = out / ".made-from", _stamp(python)
    if stamp.is_file() and stamp.read_text() == want:
        return out
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--disable-pip-version-check",
            "-c",
            str(ROOT / "constraints.txt"),
            "-w",
            str(out),
            *requirements(),
            "setuptools",
            # Needed by redis on the image's Python (Debian's 3.11.2: a marker for < 3.11.3),
            # which a newer host Python does not resolve.
            *IMAGE_ONLY,
        ],
        check=True,
    )
    stamp.write_text(want)
    return out


if __name__ == "__main__":
    print("\n".join(requirements()) if sys.argv[1:] == ["--requirements"] else build())
