"""The proxy's ASGI app: the route table on FastAPI, the middleware, the OpenAPI document."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from protos.version import VERSION
from proxy import routes, schemas
from proxy.api import HealthEndpoints, PipelineEndpoints
from proxy.grpc_door import grpc_door
from proxy.middleware import RequestContext
from proxy.problems import Problem, error_response
from proxy.settings import ProxySettings
from proxy.state import ProxyState
from proxy.v2api import V2Endpoints

TITLE = "inference-mesh proxy"
DESCRIPTION = "Runs REST requests through pipelines of v2 gRPC services."


def create_app(
    settings: ProxySettings | None = None, environ: Mapping[str, str] | None = None
) -> FastAPI:
    """The app; pipelines are loaded (and checked) here, so a bad definition fails at once."""
    settings = settings or ProxySettings()
    state = ProxyState.build(settings, environ)
    pipelines, health, v2 = PipelineEndpoints(state), HealthEndpoints(state), V2Endpoints(state)
    door = None if settings.grpc_port is None else grpc_door(state, settings.grpc_port)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if door is not None:
            await door.start()
        yield
        if door is not None:
            await door.stop()
        await state.channels.close()

    app = FastAPI(title=TITLE, version=VERSION, lifespan=lifespan, description=DESCRIPTION)
    for route in routes.table(pipelines, health, v2):
        app.add_api_route(route.path, route.endpoint, methods=[route.method], **route.docs)
    # Starlette runs the middleware added last first: the request id and API key come first.
    app.add_middleware(routes.PipelineRoute, handler=pipelines.infer)
    open_paths = {p.strip() for p in settings.open_paths.split(",") if p.strip()}
    app.add_middleware(RequestContext, api_key=settings.api_key, open_paths=open_paths)

    async def on_error(request: Request, exc: Exception) -> Response:
        return error_response(exc, getattr(request.state, "request_id", ""))

    # Anything else (a bug) is answered by RequestContext, outside Starlette's error layer.
    for kind in (Problem, StarletteHTTPException):
        app.add_exception_handler(kind, on_error)

    enums = {"name": sorted(state.plans), "model": sorted([*state.plans, *state.models()])}
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
            schemas.add_components(document, schemas.InferenceRequest)
            schemas.enumerate_path_parameters(document, enums)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
