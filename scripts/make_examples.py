"""Writes the README's example images (docs/examples/), drawn by the tests' seeded
generators: `python scripts/make_examples.py`."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.digits import load_split  # noqa: E402
from samples import digits, text  # noqa: E402

OUT = ROOT / "docs" / "examples"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    split = load_split()
    held_out = split.test_idx[7]  # a held-out sample: never seen in training
    look = digits.Look(
        digit_px=90,
        margins=(0.35, 0.2, 0.25, 0.3),
        interpolation=1,  # linear
        ink=(120, 40, 10),  # dark blue (BGR)
        paper=(190, 235, 245),  # cream
        texture=10.0,
        angle=6.0,
    )
    rng = np.random.default_rng(2026)
    image = digits.draw(split.images[held_out], look, rng)
    (OUT / "digit.jpg").write_bytes(digits.encode(image, 85))
    print(f"digit.jpg: held-out sample {held_out}, label {split.target[held_out]}")
    lines = ["Invoice 2026-11-23, order KT-48", "Total due: 1284.50 by transfer"]
    page = text.draw(
        lines,
        text.Look(lines=2, size=30, font=3, paper=(240, 250, 255), paper_to=(170, 200, 215)),
        rng,
    )
    (OUT / "page.jpg").write_bytes(text.encode(page, 85))
    print("page.jpg:", lines)


if __name__ == "__main__":
    main()
