"""One attempt of a job: its input through the same engine as /infer (same steps, deadlines,
merged calls, caches), as a background request; what /infer would have answered."""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass
from typing import Any

from protos import tracing
from protos.tracing import Shape, SpanKind
from proxy.engine.cache.entries import unpack
from proxy.engine.runner import Engine
from proxy.errors import Problem, StepError
from proxy.jobs.model import Claimed

RETRYABLE = frozenset({502, 503, 504})
"""Errors another attempt may not meet (a service down, overloaded or late); any other is
the input's (400, 413, 415, ...), the same on every attempt."""


@dataclass(frozen=True)
class Outcome:
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    """As /infer's error body: {"status", "error", plus step, code, pipeline where known}."""

    @property
    def retryable(self) -> bool:
        return self.error is not None and self.error["status"] in RETRYABLE


def failure(problem: Problem) -> dict[str, Any]:
    return {"status": problem.status, "error": problem.message, **problem.extra}


async def attempt(engine: Engine, claimed: Claimed, share: float) -> Outcome:
    """The job's input through its pipeline, with its budget from when it gets room. With
    traces on, in a span of the submitting request's trace (its steps under it): a job's run
    was a trace of its own for every step, found by nobody."""
    if not tracing.ENABLED:
        return await _attempt(engine, claimed, share)
    job = claimed.job
    attributes = {"mesh.job_id": job.id, "mesh.job_attempt": job.attempts}
    parent = tracing.extract(claimed.traceparent)
    with tracing.span(_shape(job.pipeline), parent, attributes=attributes) as span:
        outcome = await _attempt(engine, claimed, share)
        if outcome.error is not None:
            tracing.error(span, f"HTTP {outcome.error['status']}: {outcome.error['error']}")
        return outcome


@functools.lru_cache(maxsize=256)
def _shape(pipeline: str) -> Shape:
    attributes = (("messaging.operation.type", "process"), ("mesh.pipeline", pipeline))
    return tracing.shape(f"job {pipeline}", SpanKind.CONSUMER, attributes)


async def _attempt(engine: Engine, claimed: Claimed, share: float) -> Outcome:
    job = claimed.job
    started = time.perf_counter()
    request_id = f"job-{job.id}-{job.attempts}"
    try:
        plan = engine.plan(job.pipeline)
        deadline = asyncio.get_running_loop().time() + job.budget_ms / 1000
        try:
            async with engine.ticket(plan, deadline, background=share) as ticket:
                if claimed.kind == "image":
                    ticket.ledger.hold(len(claimed.payload))
                    run = await ticket.run(claimed.payload, request_id)
                else:
                    run = await ticket.run_tensors(unpack(claimed.payload).tensors, request_id)
                return Outcome(result=engine.answer(job.pipeline, request_id, run, started))
        except StepError as exc:
            raise exc.problem(job.pipeline) from None
        except TimeoutError:
            raise Problem(504, "the job's attempt ran out of its budget") from None
    except Problem as exc:
        return Outcome(error=failure(exc))
    except ValueError as exc:  # a stored input that no longer unpacks
        return Outcome(error={"status": 400, "error": f"the job's input: {exc}"})
