"""Calls too large for one message, or for a model's batch, split along the batch axis.

A page of ~1,000 words made 340 direction-classifier windows (the model takes 256 rows
a call) and tensors that can pass the 64 MB message limit. For a model that batches
(its ModelConfig says max_batch_size > 0, so rows are independent), the proxy sends the
rows in chunks that fit both, at most `PARALLEL` at a time, and joins the answers in row
order; outputs whose other dimensions differ between chunks (a ragged model's, padded
per chunk) are padded with zeros to the widest, as the model pads within a chunk. A call
to a model that does not batch, or a single row too large for a message, is refused
with 413. Chunks are sized by what is sent; an answer over the limit is a 413 too.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping

import grpc
import numpy as np

from protos.codec import content_bytes
from proxy.errors import StepError

PARALLEL = 4
HEADROOM = 0.9
"""Share of the message limit a chunk's tensors may fill (the rest: the message around)."""

Call = Callable[[Mapping[str, np.ndarray]], Awaitable[dict[str, np.ndarray]]]


def nbytes(array: np.ndarray) -> int:
    """A tensor's size on the wire (a BYTES element with its 4-byte length prefix)."""
    return content_bytes(array, 4)


def plan(
    inputs: Mapping[str, np.ndarray], max_batch: int, max_message: int, step: str
) -> list[slice] | None:
    """Row ranges to send, or None when one call will do."""
    size = sum(nbytes(a) for a in inputs.values())
    rows = {a.shape[0] for a in inputs.values() if a.ndim}
    limit = int(max_message * HEADROOM)
    if size <= limit and (max_batch == 0 or not rows or max(rows) <= max_batch):
        return None
    if max_batch == 0 or len(rows) != 1:
        raise StepError(
            step,
            grpc.StatusCode.OUT_OF_RANGE,
            f"the call's tensors take {size >> 20} MiB, more than a message may carry "
            f"({max_message >> 20} MiB), and the model does not batch, so they cannot be split",
            http=413,
        )
    (n,) = rows
    per_row = math.ceil(size / max(n, 1))
    if per_row > limit:
        raise StepError(
            step,
            grpc.StatusCode.OUT_OF_RANGE,
            f"one row of the call takes {per_row >> 20} MiB, more than a message may carry "
            f"({max_message >> 20} MiB)",
            http=413,
        )
    chunk = max(1, min(max_batch, limit // per_row))
    return [slice(i, min(i + chunk, n)) for i in range(0, n, chunk)]


async def call_in_chunks(
    call: Call, inputs: Mapping[str, np.ndarray], chunks: list[slice]
) -> dict[str, np.ndarray]:
    gate = asyncio.Semaphore(PARALLEL)

    async def one(rows: slice) -> dict[str, np.ndarray]:
        async with gate:
            return await call({name: array[rows] for name, array in inputs.items()})

    tasks = [asyncio.ensure_future(one(rows)) for rows in chunks]
    try:
        answers = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    return {name: _join([a[name] for a in answers]) for name in answers[0]}


def _join(parts: list[np.ndarray]) -> np.ndarray:
    if len({p.shape[1:] for p in parts}) > 1:
        widest = np.max([p.shape[1:] for p in parts], axis=0)
        parts = [
            np.pad(
                p, [(0, 0), *[(0, int(w - d)) for w, d in zip(widest, p.shape[1:], strict=True)]]
            )
            for p in parts
        ]
    return np.concatenate(parts, axis=0)
