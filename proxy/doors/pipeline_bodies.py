"""A pipeline request's budget and body, as every door that runs one reads them: the budget
from X-Request-Timeout-Ms (or the pipeline's), the body an upload or the declared tensors."""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import Request

from proxy.doors import tensor_bodies
from proxy.doors.uploads import UploadLimits, read_body
from proxy.engine.ledger import Ledger
from proxy.engine.plan import Plan
from proxy.errors import Problem

PARSE_IN_THREAD = 256 * 1024
"""JSON bodies larger than this are parsed in a worker thread."""


def budget_s(request: Request, default_ms: float, cap_ms: float) -> float:
    """The request's budget: X-Request-Timeout-Ms, or the pipeline's, capped."""
    raw = request.headers.get("x-request-timeout-ms")
    if raw is None:
        return min(default_ms, cap_ms) / 1000
    try:
        value = float(raw)
    except ValueError:
        raise Problem(
            400, f"X-Request-Timeout-Ms must be a number of milliseconds, not {raw!r}"
        ) from None
    if not value > 0:
        raise Problem(400, "X-Request-Timeout-Ms must be positive")
    return min(value, cap_ms) / 1000


async def read_tensors(
    request: Request, plan: Plan, limits: UploadLimits, deadline: float, ledger: Ledger
) -> dict[str, np.ndarray]:
    """The body of a pipeline taking tensors (tensor_bodies.py); its bytes on the ledger
    while it is read, then replaced there by the tensors'."""
    declared = plan.pipeline.inputs or {}
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("application/json", "multipart/form-data"):
        raise Problem(
            415,
            f"pipeline '{plan.name}' takes tensors ({', '.join(declared)}): send them as "
            "application/json (an object of nested lists) or multipart/form-data",
        )
    raw = await read_body(request, limits, deadline, ledger)
    if kind == "multipart/form-data":
        inputs = await tensor_bodies.from_form(request, raw, declared, limits.max_bytes)
    elif len(raw) > PARSE_IN_THREAD:  # a long number list once held the loop for seconds
        inputs = await asyncio.to_thread(tensor_bodies.from_json, raw, declared)
    else:
        inputs = tensor_bodies.from_json(raw, declared)
    ledger.release(len(raw))
    return inputs
