"""The proxy's ASGI app: the route table on FastAPI, the middleware, the OpenAPI document."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from protos import heap
from protos.version import VERSION
from proxy import workers
from proxy.doors import console, routes, schemas, v2plane
from proxy.doors.grpc_door import grpc_door
from proxy.doors.grpc_front import GrpcFront
from proxy.doors.health import HealthEndpoints
from proxy.doors.jobs import JobEndpoints
from proxy.doors.middleware import RequestContext
from proxy.doors.responses import error_response
from proxy.doors.rest import PipelineEndpoints
from proxy.doors.v2rest import V2Endpoints
from proxy.engine.audit import Audit
from proxy.errors import Problem
from proxy.settings import ProxySettings
from proxy.state import ProxyState

TITLE = "inference-mesh proxy"
DESCRIPTION = "Runs REST requests through pipelines of v2 gRPC services."
DOCS_ASSETS = "/docs-assets"
"""Where /docs and /redoc load Swagger UI and ReDoc from."""
NO_FASTAPI_TELEMETRY: dict = {"tracing": False, "metrics": False, "logs": False}
"""FastAPI's own OpenTelemetry off: the mesh traces and measures itself (protos/tracing.py,
proxy/metrics.py), and FastAPI asked OpenTelemetry for its three providers on every request
to find out (~3% of a cache hit's cost)."""


EXPOSED_HEADERS = [
    "X-Request-Id",
    "X-Cache",
    "Retry-After",
    "Location",
    "Idempotent-Replayed",
]
"""The mesh's answer headers a browser page may read (CORS hides all but a few otherwise)."""


def create_app(
    settings: ProxySettings | None = None,
    environ: Mapping[str, str] | None = None,
    own_process: bool = False,
) -> FastAPI:
    """The app; pipelines are loaded (and checked) here, so a bad definition fails at once.
    `own_process`: the app is the process's (`python -m proxy`), whose start-up objects are
    then set aside from the garbage collector (protos/heap.py); never a test's."""
    settings = settings or ProxySettings()
    state = ProxyState.build(settings, environ)
    plane = v2plane.build(state)
    pipelines, health = PipelineEndpoints(state), HealthEndpoints(state)
    jobs = JobEndpoints(state, state.jobs)
    v2 = V2Endpoints(state, plane)
    # Each of several workers serves the same port.
    shared = workers.SUPERVISED in os.environ
    door = None
    if settings.grpc_door_port is not None:  # behind the front (proxy/doors/grpc_front_nginx.py)
        door = grpc_door(state, settings.grpc_door_port, plane, shared, host="127.0.0.1")
    elif settings.grpc_port is not None:
        door = grpc_door(state, settings.grpc_port, plane, shared)

    engine = state.engine
    audit = Audit(engine.plans, engine.executor.wiring, settings.wiring_check_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The door's server starts the plane's pipelines; without a door, they start here.
        await (plane.registry.start() if door is None else door.start())
        state.jobs.start()
        audit.start()
        if own_process:
            heap.settle()  # the collector set for serving
        yield
        await audit.stop()
        await state.jobs.stop()
        await (plane.registry.stop() if door is None else door.stop())
        await engine.close()
        await state.channels.close()

    # /docs and /redoc from the assets fastapi-offline ships (no CDN: they work air-gapped).
    app = FastAPIOffline(
        title=TITLE,
        version=VERSION,
        lifespan=lifespan,
        description=DESCRIPTION,
        static_url=DOCS_ASSETS,
        telemetry=NO_FASTAPI_TELEMETRY,
    )
    table = routes.table(pipelines, health, v2, jobs)
    if state.engine.recent is not None:
        table += console.routes(console.ConsoleEndpoints(state.engine.recent))
    for route in table:
        app.add_api_route(route.path, route.endpoint, methods=[route.method], **route.docs)
    if state.engine.recent is not None:  # last: the routes above are matched first
        app.mount(console.PAGE, console.page())
    # Starlette runs the middleware added last first: the request id and API key come first.
    app.add_middleware(
        routes.InferenceRoutes,
        handlers={"infer": pipelines.infer, "jobs": jobs.submit},
        v2_infer=v2.infer,
    )
    open_paths = {p.strip() for p in settings.open_paths.split(",") if p.strip()}
    app.add_middleware(RequestContext, api_key=settings.api_key, open_paths=open_paths)
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if origins:  # outside RequestContext: a browser's preflight carries no API key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["*"],
            expose_headers=EXPOSED_HEADERS,
            max_age=settings.cors_max_age_s,
        )
    if door is not None:  # the gRPC front's unary calls, answered as gRPC, before all else
        wait_s = settings.max_timeout_ms / 1000
        app.add_middleware(
            GrpcFront,
            door=door,
            admission=state.engine.admission,
            api_key=settings.api_key,
            max_wait_s=wait_s,
            max_message_bytes=int(settings.door_message_mb() * (1 << 20)),
        )

    async def on_error(request: Request, exc: Exception) -> Response:
        return error_response(exc, getattr(request.state, "request_id", ""))

    # Anything else (a bug) is answered by RequestContext, outside Starlette's error layer.
    for kind in (Problem, StarletteHTTPException):
        app.add_exception_handler(kind, on_error)

    plans = state.engine.plans
    enums = {"name": sorted(plans), "model": sorted([*plans, *state.engine.models()])}
    documented = routes.pipeline_route(pipelines)
    doc_only = APIRoute(
        documented.path, documented.endpoint, methods=[documented.method], **documented.docs
    )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=[doc_only, *app.routes],
            )
            schemas.add_components(document, schemas.InferenceRequest, schemas.IndexRequest)
            schemas.enumerate_path_parameters(document, enums)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
