"""The proxy's own REST handlers: pipelines, health, readiness, metrics."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from typing import Any

from fastapi import Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from proxy import metrics
from proxy.disconnect import until_disconnect
from proxy.errors import StepError
from proxy.fresh import Fresh
from proxy.problems import Problem, json_response
from proxy.runner import PipelineRunner, recorded, step_problem
from proxy.state import ProxyState
from proxy.uploads import read_image


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


class PipelineEndpoints:
    def __init__(self, state: ProxyState) -> None:
        self.state = state
        self.runner = PipelineRunner(state)

    async def infer(self, request: Request, name: str) -> Response:
        """POST /v1/pipelines/{name}/infer: an image through a pipeline."""
        state = self.state
        plan = self.runner.plan(name)
        request_id = request.state.request_id
        started = time.perf_counter()
        ledger = state.admission.ledger()
        try:
            with recorded(name):
                # The budget starts now: it covers the upload too.
                deadline = asyncio.get_running_loop().time() + budget_s(
                    request, plan.pipeline.timeout_ms, state.settings.max_timeout_ms
                )
                state.admission.check_room()
                body = await read_image(request, state.uploads, deadline, ledger)
                run = await until_disconnect(
                    request, self.runner.run(plan, body, request_id, deadline, ledger)
                )
                result = state.executor.result(run)
        except StepError as exc:
            raise step_problem(exc, name) from None
        finally:
            ledger.close()
        return json_response(
            {
                "id": request_id,
                "pipeline": name,
                "result": result,
                "partial": run.partial,
                "steps": [s.__dict__ for s in run.steps],
                "latency_ms": round((time.perf_counter() - started) * 1000, 3),
            }
        )

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
                for name, plan in self.state.plans.items()
            }
        )


class HealthEndpoints:
    def __init__(self, state: ProxyState) -> None:
        self.state = state
        self._readiness = Fresh(self.readiness, state.settings.ready_cache_ms / 1000)

    async def live(self) -> Response:
        """GET /healthz and /v2/health/live."""
        return json_response({"live": True})

    async def ready(self) -> Response:
        """GET /readyz: every (endpoint, model) any pipeline calls, checked at once (at
        most once per PROXY_READY_CACHE_MS, whoever asks: proxy/fresh.py)."""
        report = await self._readiness.get()
        ready = all(item["ready"] for item in report.values())
        return json_response({"ready": ready, "endpoints": report}, 200 if ready else 503)

    async def readiness(self) -> dict[str, dict[str, Any]]:
        state = self.state
        pairs: dict[tuple[str, str], str] = {}
        for plan in state.plans.values():
            for target in plan.targets.values():
                pairs[(target.address, target.model)] = target.endpoint
        timeout = state.settings.ready_timeout_ms / 1000
        checks = await asyncio.gather(*(state.channels.ready(a, m, timeout) for a, m in pairs))
        report: dict[str, dict[str, Any]] = {}
        for ((address, model), variable), (ok, why) in zip(pairs.items(), checks, strict=True):
            report[f"{variable}/{model}"] = {
                "address": address,
                "model": model,
                "ready": ok,
                **({"error": why} if why else {}),
            }
        return report

    async def metrics(self) -> Response:
        """GET /metrics: the proxy's own Prometheus metrics."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
