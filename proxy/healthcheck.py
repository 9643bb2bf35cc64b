"""`python -m proxy.healthcheck URL`: exit 0 when GET URL answers 200 (container healthcheck)."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with urllib.request.urlopen(argv[0], timeout=3) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError):
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
