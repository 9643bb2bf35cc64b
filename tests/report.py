"""Figures the suites measure (fault-scenario summaries, accuracy, CER): printed where they
are measured (seen with -s) and repeated at the end of every run, so the CI log has them."""

from __future__ import annotations

LINES: list[str] = []


def report(line: str) -> None:
    LINES.append(line.strip())
    print("\n" + LINES[-1])
