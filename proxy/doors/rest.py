"""The /v1 REST door: an image through a pipeline, and the list of pipelines."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict

import numpy as np
from fastapi import Request, Response

from proxy.doors import tensor_bodies
from proxy.doors.disconnect import until_disconnect
from proxy.doors.responses import json_response
from proxy.doors.uploads import UploadLimits, read_body, read_image
from proxy.engine.admission import Ledger
from proxy.engine.cache.stores import StoreError
from proxy.engine.plan import Plan
from proxy.errors import Problem, StepError
from proxy.state import ProxyState

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


class PipelineEndpoints:
    def __init__(self, state: ProxyState) -> None:
        self.state = state
        self.engine = state.engine

    async def infer(self, request: Request, name: str) -> Response:
        """POST /v1/pipelines/{name}/infer: an image (or the tensors a pipeline declares as
        its `inputs`) through a pipeline."""
        state, engine = self.state, self.engine
        plan = engine.plan(name)
        request_id = request.state.request_id
        started = time.perf_counter()
        # The budget starts now: it covers the upload too.
        deadline = asyncio.get_running_loop().time() + budget_s(
            request, plan.pipeline.timeout_ms, state.settings.max_timeout_ms
        )
        try:
            async with engine.ticket(plan, deadline) as ticket:
                if plan.pipeline.inputs is None:
                    body = await read_image(request, state.uploads, deadline, ticket.ledger)
                    running = ticket.run(body, request_id)
                else:
                    inputs = await read_tensors(
                        request, plan, state.uploads, deadline, ticket.ledger
                    )
                    running = ticket.run_tensors(inputs, request_id)
                run = await until_disconnect(request, running)
                answer = engine.answer(name, request_id, run, started)
        except StepError as exc:
            raise exc.problem(name) from None
        headers = {"X-Cache": run.cache} if run.cache else None
        return json_response(answer, headers=headers)

    async def clear_cache(self, name: str) -> Response:
        """DELETE /v1/pipelines/{name}/cache: drop the pipeline's cached answers and its
        steps' cached outputs (in Redis, every proxy's)."""
        plan = self.engine.plan(name)
        caches = self.engine.caches
        if caches is None or not caches.has(plan.name):
            raise Problem(404, f"pipeline '{name}' has no cache (`cache:` in its definition)")
        try:
            cleared = await caches.clear(name)
        except StoreError as exc:
            raise Problem(503, f"the cache cannot be reached: {exc}") from None
        return json_response({"pipeline": name, "cleared": cleared})

    async def list_pipelines(self) -> Response:
        """GET /v1/pipelines."""
        return json_response(
            {
                name: {
                    "description": plan.pipeline.description,
                    "timeout_ms": plan.pipeline.timeout_ms,
                    "targets": {k: asdict(t) for k, t in plan.targets.items()},
                    "definition": plan.pipeline.model_dump(mode="json", exclude_defaults=True),
                }
                for name, plan in self.engine.plans.items()
            }
        )
