"""The proxy's REST API (FastAPI): pipelines, health, metrics, and the v2 REST protocol."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Path, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from protos import media
from proxy import definitions, metrics, schemas, v2rest
from proxy.admission import Admission, PipelineLimits
from proxy.client import Channels
from proxy.disconnect import ClientGone, until_disconnect
from proxy.errors import StepError
from proxy.executor import Executor
from proxy.middleware import RequestContext
from proxy.problems import Problem, error_response, json_response
from proxy.settings import ProxySettings
from proxy.uploads import read_image
from v2server.tls import channel_credentials

log = logging.getLogger("proxy")


class PipelineRoute:
    """Answers POST /v1/pipelines/{name}/infer before FastAPI's router, dependency and
    exception layers (0.2-0.45 ms of a ~8 ms digits request at concurrency 1 on two cores,
    measured A/B); the route stays declared on the app, which documents it."""

    PREFIX, SUFFIX = "/v1/pipelines/", "/infer"

    def __init__(
        self, app: ASGIApp, handler: Callable[[Request, str], Awaitable[Response]]
    ) -> None:
        self.app = app
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        name = path[len(self.PREFIX) : -len(self.SUFFIX)]
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or not (path.startswith(self.PREFIX) and path.endswith(self.SUFFIX))
            or not name
            or "/" in name
        ):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await self.handler(request, name)
        except ClientGone:
            return  # nobody to answer; the pipeline's calls were cancelled
        except Exception as exc:
            response = error_response(exc, request.state.request_id)
        await response(scope, receive, send)


def budget_s(request: Request, default_ms: float, cap_ms: float) -> float:
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


def create_app(
    settings: ProxySettings | None = None, environ: Mapping[str, str] | None = None
) -> FastAPI:
    """The app; pipelines are loaded (and checked) here, so a bad definition fails at once."""
    settings = settings or ProxySettings()
    env = os.environ if environ is None else environ
    plans = definitions.load(settings.pipelines, env)
    credentials = channel_credentials(settings.tls_ca, settings.tls_cert, settings.tls_key)
    channels = Channels(settings.max_message_mb, credentials)
    executor = Executor(channels)
    uploads = settings.upload_limits()
    admission = Admission(
        settings.max_in_flight,
        int(settings.max_inflight_mb * 2**20),
        int(settings.max_request_mb * 2**20),
        {
            name: PipelineLimits(
                plan.pipeline.max_in_flight,
                None
                if plan.pipeline.max_inflight_mpx is None
                else int(plan.pipeline.max_inflight_mpx * 1e6),
            )
            for name, plan in plans.items()
        },
    )
    open_paths = {p.strip() for p in settings.open_paths.split(",") if p.strip()}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await channels.close()

    app = FastAPI(
        title="inference-mesh proxy",
        version="0.1.0",
        lifespan=lifespan,
        description="Runs REST requests through pipelines of v2 gRPC services.",
    )
    # Starlette runs the middleware added last first: the request id and API key come first.
    app.add_middleware(PipelineRoute, handler=lambda request, name: run_pipeline(request, name))
    app.add_middleware(RequestContext, api_key=settings.api_key, open_paths=open_paths)

    async def on_error(request: Request, exc: Exception) -> Response:
        return error_response(exc, getattr(request.state, "request_id", ""))

    # Anything else (a bug) is answered by RequestContext, outside Starlette's error layer.
    for kind in (Problem, StarletteHTTPException):
        app.add_exception_handler(kind, on_error)

    @app.post(
        "/v1/pipelines/{name}/infer",
        summary="Run an image through a pipeline",
        response_model=schemas.PipelineAnswer,
        responses=schemas.errors(400, 401, 404, 408, 413, 415, 422, 429, 501, 502, 503, 504),
        openapi_extra=schemas.IMAGE_BODY,
    )
    async def infer(
        request: Request,
        name: str = Path(json_schema_extra={"enum": sorted(plans)}),
    ) -> Response:
        # Served by PipelineRoute; declared here for the OpenAPI document.
        return await run_pipeline(request, name)

    async def run_pipeline(request: Request, name: str) -> Response:
        request_id = request.state.request_id
        plan = plans.get(name)
        if plan is None:
            raise Problem(404, f"unknown pipeline '{name}' (known: {', '.join(sorted(plans))})")
        started = time.perf_counter()
        ledger = admission.ledger()
        status = "500"
        try:
            # The budget starts now: it covers the upload too.
            deadline = asyncio.get_running_loop().time() + budget_s(
                request, plan.pipeline.timeout_ms, settings.max_timeout_ms
            )
            admission.check_room()
            body = await read_image(request, uploads, deadline, ledger)
            accepted = plan.pipeline.accept
            if accepted is not None and media.sniff(body) not in accepted:
                raise Problem(
                    415,
                    f"the upload is {media.describe(body)}; pipeline '{name}' takes "
                    + ", ".join(media.ACCEPTED[k] for k in accepted),
                )
            width, height = media.declared_size(body) or (0, 0)
            async with admission.admit(name, width * height):
                run = await until_disconnect(
                    request, executor.run(plan, body, request_id, deadline, ledger)
                )
                result = executor.result(run)
            status = "200"
        except StepError as exc:
            status = str(exc.http_status)
            log.info(
                "step failed",
                extra={"fields": {"pipeline": name, "step": exc.step, "code": exc.code.name}},
            )
            raise Problem(
                exc.http_status, str(exc), step=exc.step, code=exc.code.name, pipeline=name
            ) from None
        except Problem as exc:
            status = str(exc.status)
            raise
        except ClientGone:
            status = "499"  # nginx's "client closed request": recorded, never sent
            log.info("client went away", extra={"fields": {"pipeline": name}})
            raise
        finally:
            ledger.close()
            metrics.REQUESTS.labels(name, status).inc()
            metrics.LATENCY.labels(name).observe(time.perf_counter() - started)
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

    @app.get(
        "/v1/pipelines",
        summary="Pipelines and their resolved endpoints",
        response_model=dict[str, schemas.PipelineInfo],
        responses=schemas.errors(401),
    )
    async def list_pipelines() -> Response:
        return json_response(
            {
                name: {
                    "description": plan.pipeline.description,
                    "timeout_ms": plan.pipeline.timeout_ms,
                    "targets": {k: t.model_dump() for k, t in plan.targets.items()},
                    "definition": plan.pipeline.model_dump(mode="json", exclude_defaults=True),
                }
                for name, plan in plans.items()
            }
        )

    @app.get(
        "/healthz",
        summary="Liveness",
        response_model=schemas.Liveness,
        responses=schemas.errors(401),
    )
    async def healthz() -> Response:
        return json_response({"live": True})

    @app.get(
        "/readyz",
        summary="Every endpoint ready (v2 ServerReady/ModelReady)",
        response_model=schemas.Readiness,
        responses={503: {"model": schemas.Readiness}, **schemas.errors(401)},
    )
    async def readyz() -> Response:
        report = await readiness(plans, channels, settings.ready_timeout_ms / 1000)
        ready = all(item["ready"] for item in report.values())
        return json_response({"ready": ready, "endpoints": report}, 200 if ready else 503)

    @app.get(
        "/metrics",
        summary="Prometheus metrics",
        response_class=PlainTextResponse,
        responses=schemas.errors(401),
    )
    async def prometheus() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    v2rest.mount(app, plans, channels, uploads, settings.v2_timeout_ms / 1000)
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schemas.add_components(generate(), schemas.InferenceRequest)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]
    return app


async def readiness(
    plans: Mapping[str, definitions.Plan], channels: Channels, timeout: float
) -> dict[str, dict[str, Any]]:
    """One check per (address, model) pair any pipeline uses."""
    pairs: dict[tuple[str, str], str] = {}
    for plan in plans.values():
        for target in plan.targets.values():
            pairs[(target.address, target.model)] = target.endpoint
    checks = await asyncio.gather(*(channels.ready(a, m, timeout) for a, m in pairs))
    report: dict[str, dict[str, Any]] = {}
    for ((address, model), variable), (ok, why) in zip(pairs.items(), checks, strict=True):
        report[f"{variable}/{model}"] = {
            "address": address,
            "model": model,
            "ready": ok,
            **({"error": why} if why else {}),
        }
    return report
