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

Measured side by side over one mesh: bench/README.md, 2026-11-27."""

from __future__ import annotations

import gc

from protos.metric_types import Gauge

YOUNG = 7_000
"""Allocations (beyond frees) between two young collections; CPython's default is 700."""

FROZEN = Gauge(
    "python_gc_frozen_objects",
    "Objects set aside from the garbage collector's passes after start-up (gc.freeze)",
    multiprocess_mode="max",  # several proxy workers: the largest
)


def settle() -> None:
    """Collect once, move every object left into the collector's permanent generation (still
    reclaimed by reference counting, never scanned for cycles), and space the young
    collections out. Call when start-up is done, before the first request."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
    FROZEN.set(gc.get_freeze_count())
