"""The garbage collector of a long-running process of the mesh, set for serving once start-up
is done (proxy, job worker, services; never a test's process).

- **Start-up objects frozen.** A started proxy holds ~97,000 objects the collector tracks
  (modules, classes, pydantic and FastAPI's models, grpc, numpy), nearly all alive for good.
  Every full collection walked them all: ~65 ms of a stalled event loop each, ~every 2 s
  under load, the largest share of the proxy's p99. Frozen (`gc.freeze`, as CPython's
  documentation suggests for servers), a full pass walks only what was made since: ~8 ms.
- **Young collections rarer.** A request makes hundreds of short-lived objects; at CPython's
  default (a young collection every 700 more allocations than frees) the proxy ran one every
  ~4 requests, each walking the requests in flight: ~7% of its CPU. At 7,000: a tenth as
  many, ~0.35 s of collection where there was 1.7 s, the same memory give or take the
  thousands of objects that wait a little longer.
- **Freed memory given back.** glibc's malloc keeps what a burst freed: after freeing a
  large buffer it raises its threshold for giving buffers their own mapping (up to 32 MiB),
  so the next uploads and images come from its heaps, which it rarely returns. After crowds
  of 64 OCR photos a proxy stayed at 420 MiB (99 before), of which `malloc_trim` gave back
  300. A thread of the process asks malloc every TRIM_EVERY_S how much it holds free, and
  gives it back past TRIM_ABOVE_MB.

Measured side by side over one mesh: bench/README.md, 2026-11-27 and 2026-11-29."""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time

from protos.metric_types import Counter, Gauge

YOUNG = 7_000
"""Allocations (beyond frees) between two young collections; CPython's default is 700."""

FROZEN = Gauge(
    "python_gc_frozen_objects",
    "Objects set aside from the garbage collector's passes after start-up (gc.freeze)",
    multiprocess_mode="max",  # several proxy workers: the largest
)


TRIM_EVERY_S = 5.0
TRIM_ABOVE_MB = 64.0
"""Free memory malloc may hold before it is given back."""

TRIMMED = Counter(
    "process_heap_trimmed_bytes",
    "Resident memory malloc gave back to the system after a burst (malloc_trim)",
)


def settle() -> None:
    """Collect once, move every object left into the collector's permanent generation (still
    reclaimed by reference counting, never scanned for cycles), and space the young
    collections out; then give freed memory back after bursts. Call when start-up is done,
    before the first request."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
    FROZEN.set(gc.get_freeze_count())
    if _libc() is not None:
        threading.Thread(target=_trimming, name="heap-trim", daemon=True).start()


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def free_held_bytes() -> int:
    """Bytes malloc holds free in its heaps (glibc's mallinfo2; 0 elsewhere)."""
    libc = _libc()
    return 0 if libc is None else libc.mallinfo2().fordblks


def trim() -> int:
    """Free memory malloc holds given back now (glibc only); the resident bytes that went."""
    libc = _libc()
    if libc is None:
        return 0
    before = resident_bytes()
    libc.malloc_trim(0)  # ctypes lets go of the GIL meanwhile
    gone = max(0, before - resident_bytes())
    TRIMMED.inc(gone)
    return gone


def _trimming() -> None:
    while True:
        time.sleep(TRIM_EVERY_S)
        if free_held_bytes() > TRIM_ABOVE_MB * 2**20:
            trim()


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            *("arena", "ordblks", "smblks", "hblks", "hblkhd"),
            *("usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"),
        )
    ]


def _libc() -> ctypes.CDLL | None:
    """glibc with malloc_trim and mallinfo2 (2.33 and later), or None (musl, older)."""
    global _LIBC
    if _LIBC is False:
        try:  # glibc's name; find_library runs ldconfig, which a slim image may not have
            libc: ctypes.CDLL | None = ctypes.CDLL("libc.so.6")
        except OSError:
            libc = None
        if libc is None or not hasattr(libc, "malloc_trim") or not hasattr(libc, "mallinfo2"):
            _LIBC = None
        else:
            libc.mallinfo2.restype = _MallInfo2
            _LIBC = libc
    return _LIBC


_LIBC: ctypes.CDLL | bool | None = False
