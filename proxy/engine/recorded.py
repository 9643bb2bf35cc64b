"""A pipeline request counted and timed under the HTTP status it ends with, whichever door
it came by (Engine.ticket)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from protos import tracing
from protos.labelled import child
from proxy import metrics
from proxy.errors import ClientGone, Problem, StepError

log = logging.getLogger("proxy")


@dataclass
class Outcome:
    status: str = "500"
    """The HTTP status a request ended with (499: the client left)."""


@contextlib.contextmanager
def recorded(pipeline: str, deadline: float, outcome: Outcome) -> Iterator[None]:
    """Count the request under the status it ends with (499: the client left; a request
    cancelled at its `deadline`, loop time, by whoever enforces it: 504), kept in
    `outcome`, and time it; a failed step is logged with its code."""
    started = time.perf_counter()
    status = "500"
    try:
        yield
        status = "200"
    except StepError as exc:
        status = str(exc.http_status)
        log.info(
            "step failed",
            extra={"fields": {"pipeline": pipeline, "step": exc.step, "code": exc.code.name}},
        )
        raise
    except Problem as exc:
        status = str(exc.status)
        raise
    except (ClientGone, asyncio.CancelledError):
        if asyncio.get_running_loop().time() >= deadline:
            status = "504"
            raise
        status = "499"  # nginx's "client closed request": recorded, never sent
        log.info("client went away", extra={"fields": {"pipeline": pipeline}})
        raise
    finally:
        outcome.status = status
        child(metrics.REQUESTS, pipeline, status).inc()
        exemplar = tracing.exemplar() if tracing.ENABLED else None
        child(metrics.LATENCY, pipeline).observe(time.perf_counter() - started, exemplar)
