"""A served request's spans (protos/tracing.py; only when traces are on): the call itself
(SERVER, with OTel's `rpc.*` attributes and the model's name and version), and beneath it
the wait in the model's queue and the execution it shared with the rest of its batch.

The batcher (batcher.py) does not know about spans: it fills the request's `Timing`, found
through a context variable the call sets, with wall-clock nanoseconds; the spans are made
from those when the call ends, so a batch of forty costs its worker no span work at all.
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass

import grpc

from protos import tracing
from protos.channels import SERVICE_NAME
from protos.tracing import Span, SpanKind


@dataclass
class Timing:
    """When the request's model work began and ended, and with how much company."""

    queued_ns: int = 0
    started_ns: int = 0
    ended_ns: int = 0
    batch_requests: int = 0
    batch_rows: int = 0


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


class ServedSpan:
    """The spans of one inference call: its span is current from its making until `end`."""

    def __init__(self, method: str, model: str, version: str, parent: str | None) -> None:
        self.span: Span = tracing.start(
            f"{SERVICE_NAME}/{method}",
            SpanKind.SERVER,
            {
                "rpc.system": "grpc",
                "rpc.service": SERVICE_NAME,
                "rpc.method": method,
                "mesh.model": model,
                "mesh.model_version": version,
            },
            parent=tracing.extract(parent),
        )
        self.timing = Timing()
        self._token = tracing.activate(self.span)
        self._timing_token = TIMING.set(self.timing)

    def end(self, code: grpc.StatusCode) -> None:
        TIMING.reset(self._timing_token)
        tracing.deactivate(self._token)
        span, timing = self.span, self.timing
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code != grpc.StatusCode.OK:
            tracing.error(span, code.name)
        if timing.ended_ns:
            parent = span.context
            attributes = {"mesh.batch.requests": timing.batch_requests}
            attributes["mesh.batch.rows"] = timing.batch_rows
            queue = tracing.start("queue", parent=parent, start_time=timing.queued_ns)
            queue.end(timing.started_ns)
            execute = tracing.start(
                "execute", parent=parent, attributes=attributes, start_time=timing.started_ns
            )
            execute.end(timing.ended_ns)
        span.end()
