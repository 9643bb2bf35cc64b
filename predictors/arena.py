"""When ONNX Runtime's memory arena gives back what an execution took.

The arena keeps every byte an execution needed, for the next: after one 2560x2560 page the
OCR detector held 1.1 GB for good (169 MiB before it), after one line 8192 wide the
recogniser 245 MiB (97). Giving the memory back after every execution (Triton's
`memory.enable_memory_arena_shrinkage`) made the detector's pages 1.3x slower, each run
growing the arena again. So `outliers` gives it back only after an execution whose inputs
were more than twice the largest of the last WINDOW: the arena keeps what the usual traffic
needs, whatever it is, not what a rare giant needed (measured: the detector's usual pages
as fast, its resident memory 198 MiB against 752 with a 2000x2000 page in every ten)."""

from __future__ import annotations

import threading
from collections import deque

import onnxruntime as ort

from predictors.config import ArenaPolicy

WINDOW = 32
"""Executions the usual size is taken over."""
FACTOR = 2.0
"""An execution's inputs this many times the usual size are an outlier."""


class Arena:
    """`outliers` or `always` (`keep` needs none: the model then calls ONNX Runtime as it
    is)."""

    def __init__(self, policy: ArenaPolicy) -> None:
        self.policy = policy
        self._recent: deque[int] = deque(maxlen=WINDOW)
        self._lock = threading.Lock()  # executions of one model may run on several threads
        self._shrink = ort.RunOptions()
        self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def run_options(self, input_bytes: int) -> ort.RunOptions | None:
        """The options of an execution whose inputs hold `input_bytes`: None keeps the
        arena as it grows."""
        if self.policy != "outliers":
            return self._shrink
        with self._lock:
            usual = max(self._recent, default=0)
            self._recent.append(input_bytes)
        return self._shrink if usual and input_bytes > FACTOR * usual else None
