"""How far a batch is: a progress bar on a terminal (tqdm: done, failed, rate, ETA), a plain
line every few seconds in logs and CI, and the summary at the end."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import TextIO

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, *, out: TextIO = sys.stderr, every_s: float = 10.0) -> None:
        self.total = total
        self.counts: Counter[str] = Counter()
        self.started = time.monotonic()
        self._out = out
        self._every_s = every_s
        self._last = self.started
        self._bar = (
            tqdm(total=total, file=out, unit="input", dynamic_ncols=True) if out.isatty() else None
        )
        self.narrowed: tuple[int, int] | None = None
        """(fewest, most) requests in flight, when the mesh said it was full (batch/window.py)."""

    @property
    def sent(self) -> int:
        return self.counts["ok"] + self.counts["failed"]

    def skipped(self, n: int = 1) -> None:
        """Inputs answered by an earlier run."""
        self.counts["skipped"] += n
        if self._bar is not None:
            self._bar.update(n)

    def answered(self, status: str) -> None:
        self.counts[status] += 1
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(failed=self.counts["failed"], refresh=False)
            return
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self._last = now
            print(self.line(now), file=self._out, flush=True)

    def rate(self, now: float | None = None) -> float:
        elapsed = (now or time.monotonic()) - self.started
        return self.sent / elapsed if elapsed > 0 else 0.0

    def line(self, now: float | None = None) -> str:
        done = self.sent + self.counts["skipped"]
        rate = self.rate(now)
        left = max(0, self.total - done)
        eta = f", ETA {left / rate:.0f} s" if rate > 0 else ""
        return (
            f"batch: {done}/{self.total} ({self.counts['failed']} failed, "
            f"{self.counts['skipped']} answered before), {rate:.1f}/s{eta}"
        )

    def close(self) -> str:
        """The summary line (also printed)."""
        if self._bar is not None:
            self._bar.close()
        elapsed = time.monotonic() - self.started
        summary = (
            f"batch: {self.sent + self.counts['skipped']} inputs: {self.counts['ok']} ok, "
            f"{self.counts['failed']} failed, {self.counts['skipped']} answered before; "
            f"{self.rate():.1f}/s over {elapsed:.1f} s"
        )
        if self.counts["retried"]:
            summary += f"; {self.counts['retried']} given up on before, sent again"
        if self.narrowed is not None:
            fewest, most = self.narrowed
            summary += f"; the mesh was full at times: as few as {fewest} of {most} at once"
        print(summary, file=self._out, flush=True)
        return summary
