"""Memory a burst freed is given back to the system (protos/heap.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.procs import ROOT

BURST = """
import json
from protos import heap
big = b"\1" * (24 << 20)  # a buffer of its own mapping; freed, glibc raises its threshold
del big
burst = [b"\1" * (4 << 20) for _ in range(64)]  # so these come from the heap: 256 MiB
pin = b"\1" * (1 << 20)  # above them in the heap: its top cannot shrink
before = heap.resident_bytes()
del burst
held = heap.resident_bytes()
gone = heap.trim()
print(json.dumps({"before": before, "held": held, "after": heap.resident_bytes(), "gone": gone}))
"""


def test_memory_a_burst_freed_is_given_back() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BURST], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    sizes = {k: v / 2**20 for k, v in json.loads(done.stdout).items()}
    assert sizes["held"] > sizes["before"] - 64, sizes  # freed, but kept by malloc
    assert sizes["after"] < sizes["held"] - 200, sizes  # trimmed: given back
    assert sizes["gone"] > 200, sizes


SETTLED = """
import json, time
from protos import heap
heap.TRIM_EVERY_S = 0.05
heap.settle()  # as a serving process does once started: the trimming thread with it
big = b"\\1" * (24 << 20)
del big
burst = [b"\\1" * (4 << 20) for _ in range(64)]
pin = b"\\1" * (1 << 20)
peak = heap.resident_bytes()
time.sleep(0.2)
del burst
time.sleep(0.5)
print(json.dumps({"peak": peak, "later": heap.resident_bytes()}))
"""


def test_a_serving_process_gives_it_back_by_itself() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SETTLED], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    sizes = {k: v / 2**20 for k, v in json.loads(done.stdout).items()}
    assert sizes["later"] < sizes["peak"] - 200, sizes  # kept without the thread (above)
