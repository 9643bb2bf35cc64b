"""The /v1 REST door: an image through a pipeline, and the list of pipelines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import asdict

import numpy as np
from fastapi import Request, Response

from proxy.doors import jobs
from proxy.doors.disconnect import until_disconnect
from proxy.doors.pipeline_bodies import budget_s, read_tensors
from proxy.doors.pipeline_models import counted
from proxy.doors.responses import json_response
from proxy.doors.uploads import read_image
from proxy.engine.cache.stores import StoreError
from proxy.engine.canaries import Canary
from proxy.engine.run import Run
from proxy.engine.shadows import Shadow
from proxy.errors import Problem, StepError
from proxy.state import ProxyState


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
        # The budget starts now: it covers the upload too.
        deadline = asyncio.get_running_loop().time() + budget_s(
            request, plan.pipeline.timeout_ms, state.settings.max_timeout_ms
        )
        options = jobs.later_options(request, state, plan)  # checked before anything runs
        statistics = state.statistics[plan.name]  # the v2 doors' too: one pipeline, one count
        started = time.perf_counter_ns()
        try:
            async with engine.ticket(plan, deadline) as ticket:
                given: bytes | dict[str, np.ndarray]
                if plan.pipeline.inputs is None:
                    given = await read_image(request, state.uploads, deadline, ticket.ledger)
                    running = ticket.start(given, request_id)
                else:
                    given = await read_tensors(
                        request, plan, state.uploads, deadline, ticket.ledger
                    )
                    running = ticket.run_tensors(given, request_id)
                if not isinstance(running, Run):  # an answer kept in process is given now
                    running = await until_disconnect(request, running)
                run = running
                # From when the ticket opened, as the console's record of it: the figure the
                # client reads is the one the console shows, never more.
                answer = engine.answer(name, request_id, run, ticket.opened, as_json=True)
        except BaseException as exc:
            statistics.request(False, time.perf_counter_ns() - started)
            if isinstance(exc, StepError):
                raise exc.problem(name) from None
            raise
        elapsed = time.perf_counter_ns() - started
        counted(statistics, run.cache, elapsed)
        statistics.request(True, elapsed)
        if plan.pipeline.later is not None:  # sync-async: the rest of the answer comes later
            kind = "image" if isinstance(given, bytes) else "tensors"
            answer["later"] = await jobs.later(state, plan, kind, given, options)
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
                    "shadows": _shares(plan.shadows),
                    "canaries": _shares(plan.canaries),
                    "definition": plan.pipeline.model_dump(mode="json", exclude_defaults=True),
                }
                for name, plan in self.engine.plans.items()
            }
        )


def _shares(found: Mapping[str, Shadow] | Mapping[str, Canary]) -> dict[str, dict]:
    """Each step's shadow or canary as GET /v1/pipelines lists it: its target and percent."""
    return {
        label: {**asdict(each.target), "percent": each.percent} for label, each in found.items()
    }
