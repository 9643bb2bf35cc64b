"""One pipeline request, whichever door it came in by (REST /v1, v2 REST, v2 gRPC): the
format check, the admission, the run, and the request's metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator

from protos import media
from proxy import metrics
from proxy.admission import Ledger
from proxy.disconnect import ClientGone
from proxy.errors import StepError
from proxy.executor import Run
from proxy.plan import Plan
from proxy.problems import Problem
from proxy.state import ProxyState

log = logging.getLogger("proxy")


class PipelineRunner:
    def __init__(self, state: ProxyState) -> None:
        self.state = state

    def plan(self, name: str) -> Plan:
        plan = self.state.plans.get(name)
        if plan is None:
            known = ", ".join(sorted(self.state.plans))
            raise Problem(404, f"unknown pipeline '{name}' (known: {known})")
        return plan

    async def run(
        self, plan: Plan, body: bytes, request_id: str, deadline: float, ledger: Ledger
    ) -> Run:
        """The image through the pipeline once admitted; `body` is already on `ledger`,
        `deadline` is absolute (loop time)."""
        _check_format(body, plan.pipeline.accept, plan.name)
        width, height = media.declared_size(body) or (0, 0)
        async with self.state.admission.admit(plan.name, width * height):
            return await self.state.executor.run(plan, body, request_id, deadline, ledger)


def _check_format(body: bytes, accepted: list[str] | None, pipeline: str) -> None:
    if accepted is not None and media.sniff(body) not in accepted:
        raise Problem(
            415,
            f"the upload is {media.describe(body)}; pipeline '{pipeline}' takes "
            + ", ".join(media.ACCEPTED[k] for k in accepted),
        )


def step_problem(exc: StepError, pipeline: str) -> Problem:
    """A failed step as the answer every door gives (its status, step and code)."""
    return Problem(exc.http_status, str(exc), step=exc.step, code=exc.code.name, pipeline=pipeline)


@contextlib.contextmanager
def recorded(pipeline: str, deadline: float | None = None) -> Iterator[None]:
    """Count the request under the status it ends with (499: the client left; a request
    cancelled at its `deadline`, loop time, by whoever enforces it: 504) and time it; a
    failed step is logged with its code."""
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
        if deadline is not None and asyncio.get_running_loop().time() >= deadline:
            status = "504"
            raise
        status = "499"  # nginx's "client closed request": recorded, never sent
        log.info("client went away", extra={"fields": {"pipeline": pipeline}})
        raise
    finally:
        metrics.REQUESTS.labels(pipeline, status).inc()
        metrics.LATENCY.labels(pipeline).observe(time.perf_counter() - started)
