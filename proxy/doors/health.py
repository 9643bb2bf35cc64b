"""Health and metrics: liveness, readiness (every endpoint any pipeline calls, and the
jobs' queue), and the proxy's Prometheus metrics."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request, Response

from proxy import metrics
from proxy.doors.responses import json_response
from proxy.state import ProxyState
from proxy.transport.fresh import Fresh


class HealthEndpoints:
    def __init__(self, state: ProxyState) -> None:
        self.state = state
        self._readiness = Fresh(self.readiness, state.settings.ready_cache_ms / 1000)

    async def live(self) -> Response:
        """GET /healthz and /v2/health/live."""
        return json_response({"live": True})

    async def ready(self) -> Response:
        """GET /readyz: every (endpoint, model) any pipeline calls, checked at once (at
        most once per PROXY_READY_CACHE_MS, whoever asks: fresh.py)."""
        report = await self._readiness.get()
        ready = all(item["ready"] for item in report.values())
        return json_response({"ready": ready, "endpoints": report}, 200 if ready else 503)

    async def readiness(self) -> dict[str, dict[str, Any]]:
        state = self.state
        pairs: dict[tuple[str, str], str] = {}
        for plan in state.engine.plans.values():
            for target in plan.every_target.values():  # canaries answer clients too
                pairs[(target.address, target.model)] = target.endpoint
        timeout = state.settings.ready_timeout_ms / 1000
        queue = state.jobs.check(timeout)
        checks = await asyncio.gather(*(state.services.ready(a, m, timeout) for a, m in pairs))
        ok, why = await queue
        report: dict[str, dict[str, Any]] = {
            "PROXY_JOBS_URL/jobs": {
                "address": state.jobs.address,
                "model": "jobs",
                "ready": ok,
                **({"error": why} if why else {}),
            }
        }
        for ((address, model), variable), (ok, why) in zip(pairs.items(), checks, strict=True):
            report[f"{variable}/{model}"] = {
                "address": address,
                "model": model,
                "ready": ok,
                **({"error": why} if why else {}),
            }
        return report

    async def metrics(self, request: Request) -> Response:
        """GET /metrics: the proxy's own Prometheus metrics (OpenMetrics when asked)."""
        body, content_type = metrics.exposition(request.headers.get("accept"))
        return Response(body, media_type=content_type)
