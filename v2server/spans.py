"""A served request's spans (protos/tracing.py; only when traces are on): the call itself
(SERVER, with OTel's `rpc.*` attributes and the model's name and version), and beneath it
the wait in the model's queue and the execution it shared with the rest of its batch.

The batcher (batcher.py) does not know about spans: it fills the request's `Timing`, found
through a context variable the call sets, with wall-clock nanoseconds; the spans are made
from those when the call ends, so a batch of forty costs its worker no span work at all.
"""

from __future__ import annotations

import contextvars
import functools
import time

import grpc

from protos import tracing
from protos.channels import SERVICE_NAME
from protos.tracing import Shape, Span, SpanKind


class Timing:
    """When the request's model work began and ended, and with how much company."""

    __slots__ = ("batch_requests", "batch_rows", "ended_ns", "queued_ns", "started_ns")

    def __init__(self) -> None:
        self.queued_ns = self.started_ns = self.ended_ns = 0
        self.batch_requests = self.batch_rows = 0


TIMING: contextvars.ContextVar[Timing | None] = contextvars.ContextVar("timing", default=None)


def now_ns() -> int:
    return time.time_ns()


def queued() -> Timing | None:
    """The current request's Timing (None: traces off), its wait starting now."""
    timing = TIMING.get()
    if timing is not None:
        timing.queued_ns = now_ns()
    return timing


def ran(timing: Timing | None, started_ns: int, requests: int, rows: int) -> None:
    """The batcher's record of one request's execution (`started_ns`: wall clock; ended
    now)."""
    if timing is not None:
        timing.started_ns, timing.ended_ns = started_ns, now_ns()
        timing.batch_requests, timing.batch_rows = requests, rows


class ServedSpan(Timing):
    """The spans of one inference call (its own Timing: one object fewer a call): its span
    is current from its making until `end`."""

    __slots__ = ("_timing_token", "_token", "span")

    def __init__(self, method: str, model: str, version: str, parent: str | None) -> None:
        super().__init__()
        self.span = Span(_served(method, model, version), tracing.extract(parent))
        self._token = tracing.activate(self.span)
        self._timing_token = TIMING.set(self)

    def end(self, code: grpc.StatusCode) -> None:
        TIMING.reset(self._timing_token)
        tracing.deactivate(self._token)
        span, timing = self.span, self
        status = code.value[0]
        span.attributes = {"rpc.grpc.status_code": status}
        if status:
            tracing.error(span, code.name)
        if timing.ended_ns:
            Span(tracing.shape("queue"), span, (), timing.queued_ns).end(timing.started_ns)
            attributes = {
                "mesh.batch.requests": timing.batch_requests,
                "mesh.batch.rows": timing.batch_rows,
            }
            execute = Span(tracing.shape("execute"), span, (), timing.started_ns, attributes)
            execute.end(timing.ended_ns)
        span.end()


@functools.lru_cache(maxsize=256)
def _served(method: str, model: str, version: str) -> Shape:
    attributes = (
        ("rpc.system", "grpc"),
        ("rpc.service", SERVICE_NAME),
        ("rpc.method", method),
        ("mesh.model", model),
        ("mesh.model_version", version),
    )
    return tracing.shape(f"{SERVICE_NAME}/{method}", SpanKind.SERVER, attributes)


def _QUEUE() -> Shape:
    return tracing.shape("queue")


def _EXECUTE() -> Shape:
    return tracing.shape("execute")
