"""Per model version counters behind Triton's ModelStatistics RPC.

Triton's semantics, which perf_analyzer relies on to split a request's server time:
`inference_stats` durations count requests (a request in a batch of k is charged the
whole batch's compute time, like each of the other k - 1), `batch_stats` count model
executions by batch size, `inference_count` counts rows and `execution_count` executions.
Plain integers updated on the event loop: no locks, no cost worth measuring.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns * count


@dataclass
class Compute:
    """Concatenating inputs, running the model, splitting outputs."""

    input: Duration = field(default_factory=Duration)
    infer: Duration = field(default_factory=Duration)
    output: Duration = field(default_factory=Duration)

    def add(self, input_ns: int, infer_ns: int, output_ns: int, count: int = 1) -> None:
        self.input.add(input_ns, count)
        self.infer.add(infer_ns, count)
        self.output.add(output_ns, count)


@dataclass
class ModelStatistics:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute: Compute = field(default_factory=Compute)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    batches: dict[int, Compute] = field(default_factory=dict)
    """Batch size (rows) -> executions of that size."""
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0

    def request(self, ok: bool, ns: int) -> None:
        """One request's whole time in the server, from arrival to its answer."""
        (self.success if ok else self.fail).add(ns)

    def execution(
        self, rows: int, requests: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        self.compute.add(input_ns, infer_ns, output_ns, requests)
        batch = self.batches.get(rows)
        if batch is None:  # not setdefault: that would build a Compute on every execution
            batch = self.batches[rows] = Compute()
        batch.add(input_ns, infer_ns, output_ns)
        self.inference_count += rows
        self.execution_count += 1
        self.last_inference_ms = time.time_ns() // 1_000_000
