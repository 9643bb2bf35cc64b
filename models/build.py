"""Build the whole model repository: `python -m models.build [--out DIR]`.

Idempotent: a model whose folder is complete is left alone unless --force.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from models import digits, ocr

DEFAULT_OUT = Path(__file__).resolve().parent / "repository"
CACHE = Path(__file__).resolve().parent / "build"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.force or not digits.is_current(args.out):
        digits.build(args.out)
    else:
        print(f"digits models already in {args.out}")
    if args.force or not ocr.is_current(args.out):
        ocr.build(args.out, CACHE)
    else:
        print(f"OCR models already in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
