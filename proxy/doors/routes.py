"""Every route the proxy answers, in one table: path, method, handler, documentation."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request, Response
from fastapi.responses import PlainTextResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.doors import jobs, schemas
from proxy.doors.health import HealthEndpoints
from proxy.doors.responses import error_response
from proxy.doors.rest import PipelineEndpoints
from proxy.doors.route import Route
from proxy.doors.v2rest import V2Endpoints
from proxy.errors import ClientGone

PIPELINE_INFER = "/v1/pipelines/{name}/infer"


def table(
    pipelines: PipelineEndpoints,
    health: HealthEndpoints,
    v2: V2Endpoints,
    job_endpoints: jobs.JobEndpoints,
) -> list[Route]:
    """The routes FastAPI serves (InferenceRoutes, below, answers the inference routes first)."""
    v2_infer = {
        "tags": ["v2"],
        "response_model": schemas.InferenceResponse,
        "responses": {
            # The binary tensor extension: the JSON header, then the outputs' raw bytes.
            200: {"content": {"application/octet-stream": {}}},
            **schemas.errors(400, 401, 404, 408, 413, 429, 501, 502, 503, 504),
        },
        "openapi_extra": schemas.json_body(schemas.InferenceRequest),
    }
    v2_model = {
        "tags": ["v2"],
        "response_model": schemas.ModelMetadata,
        "responses": schemas.errors(401, 404, 429, 501, 502, 503, 504),
    }
    v2_ready = {
        "tags": ["v2"],
        "response_model": schemas.ModelReadiness,
        "responses": {503: {"model": schemas.ModelReadiness}, **schemas.errors(401, 404)},
    }
    v2_config = {
        "tags": ["v2"],
        "summary": "The model's configuration as Triton's HTTP server writes it",
        "response_model": dict[str, Any],
        "responses": schemas.errors(401, 404, 429, 501, 502, 503, 504),
    }
    v2_stats = {
        "tags": ["v2"],
        "summary": "Triton's inference statistics",
        "response_model": schemas.Statistics,
        "responses": schemas.errors(401, 404, 429, 501, 502, 503, 504),
    }
    return [
        Route(
            "GET",
            "/v1/pipelines",
            pipelines.list_pipelines,
            {
                "summary": "Pipelines and their resolved endpoints",
                "response_model": dict[str, schemas.PipelineInfo],
                "responses": schemas.errors(401),
            },
        ),
        Route(
            "DELETE",
            "/v1/pipelines/{name}/cache",
            pipelines.clear_cache,
            {
                "summary": "Drop a pipeline's cached answers and its steps' cached outputs",
                "response_model": schemas.CacheCleared,
                "responses": schemas.errors(401, 404, 503),
            },
        ),
        Route(
            "GET",
            "/healthz",
            health.live,
            {
                "summary": "Liveness",
                "response_model": schemas.Liveness,
                "responses": schemas.errors(401),
            },
        ),
        Route(
            "GET",
            "/readyz",
            health.ready,
            {
                "summary": "Every endpoint ready (v2 ServerReady/ModelReady)",
                "response_model": schemas.Readiness,
                "responses": {503: {"model": schemas.Readiness}, **schemas.errors(401)},
            },
        ),
        Route(
            "GET",
            "/metrics",
            health.metrics,
            {
                "summary": "Prometheus metrics",
                "response_class": PlainTextResponse,
                "responses": schemas.errors(401),
            },
        ),
        Route(
            "GET",
            "/v2/health/live",
            health.live,
            {
                "tags": ["v2"],
                "response_model": schemas.Liveness,
                "responses": schemas.errors(401),
            },
        ),
        Route(
            "GET",
            "/v2/health/ready",
            v2.ready,
            {
                "tags": ["v2"],
                "response_model": schemas.ServerReady,
                "responses": {503: {"model": schemas.ServerReady}, **schemas.errors(401)},
            },
        ),
        Route(
            "GET",
            "/v2",
            v2.server_metadata,
            {
                "tags": ["v2"],
                "response_model": schemas.ServerMetadata,
                "responses": schemas.errors(401),
            },
        ),
        Route(
            "POST",
            "/v2/repository/index",
            v2.repository_index,
            {
                "tags": ["v2"],
                "summary": "Every model served, with its version and state (Triton's extension)",
                "response_model": list[schemas.IndexEntry],
                "responses": schemas.errors(400, 401, 413),
                "openapi_extra": schemas.json_body(schemas.IndexRequest, required=False),
            },
        ),
        *(
            Route(
                "POST",
                f"/v2/repository/models/{{model}}/{action}",
                endpoint,
                {
                    "tags": ["v2"],
                    "summary": f"Refused (501): a model is {action}ed by the service serving it",
                    "responses": schemas.errors(401, 501),
                },
            )
            for action, endpoint in (("load", v2.load), ("unload", v2.unload))
        ),
        Route("GET", "/v2/models/stats", v2.statistics, v2_stats),
        *per_model("", v2.metadata, v2_model),
        *per_model("/ready", v2.model_ready, v2_ready),
        *per_model("/config", v2.config, v2_config),
        *per_model("/stats", v2.statistics, v2_stats),
        *per_model("/infer", v2.infer, v2_infer, method="POST"),
        *jobs.routes(job_endpoints),
    ]


def per_model(
    suffix: str,
    endpoint: Callable[..., Awaitable[Response]],
    docs: dict[str, Any],
    method: str = "GET",
) -> list[Route]:
    """The route at /v2/models/{model}<suffix> and at .../versions/{version}<suffix>: the
    handler takes `version` (default: the newest), which the first path does not have."""
    takes_request = "request" in inspect.signature(endpoint).parameters
    if takes_request:

        async def newest(request: Request, model: str) -> Response:
            return await endpoint(request, model)

    else:

        async def newest(model: str) -> Response:  # type: ignore[misc]
            return await endpoint(model)

    newest.__doc__, newest.__name__ = endpoint.__doc__, endpoint.__name__
    return [
        Route(method, f"/v2/models/{{model}}{suffix}", newest, docs),
        Route(method, f"/v2/models/{{model}}/versions/{{version}}{suffix}", endpoint, docs),
    ]


def pipeline_route(pipelines: PipelineEndpoints) -> Route:
    """Documented in the OpenAPI document; served by InferenceRoutes, never by the router."""
    return Route(
        "POST",
        PIPELINE_INFER,
        pipelines.infer,
        {
            "summary": "Run an image through a pipeline",
            "response_model": schemas.PipelineAnswer,
            "responses": schemas.errors(400, 401, 404, 408, 413, 415, 422, 429, 501, 502, 503, 504),
            "openapi_extra": {
                **schemas.IMAGE_BODY,
                "parameters": [*schemas.IMAGE_BODY["parameters"], *jobs.LATER_PARAMETERS],
            },
        },
    )


class InferenceRoutes:
    """Answers the inference routes before FastAPI's router, dependency and exception layers:
    POST /v1/pipelines/{name}/infer and .../jobs (0.2-0.45 ms of a ~8 ms digits request at
    concurrency 1 on two cores, measured A/B), and POST
    /v2/models/{model}[/versions/{version}]/infer (they were 15% of the proxy's instructions
    a v2 REST request, 3.65M -> 3.11M: bench/README, session 65). Any other path, or a v2
    path of another method, goes on to the router, which reads path segments as this does."""

    PREFIX = PIPELINE_INFER.split("{name}")[0]
    V2_MODELS = "/v2/models/"

    def __init__(
        self,
        app: ASGIApp,
        handlers: dict[str, Callable[[Request, str], Awaitable[Response]]],
        v2_infer: Callable[[Request, str, str], Awaitable[Response]],
    ) -> None:
        self.app = app
        self.handlers = handlers
        """The last segment of a /v1 path ("infer", "jobs") -> its handler."""
        self.v2_infer = v2_infer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http":
            if path.startswith(self.PREFIX):
                name, _, last = path[len(self.PREFIX) :].partition("/")
                handler = self.handlers.get(last)
                if name and handler:
                    await self._answer(scope, receive, send, handler, name)
                    return
            elif path.startswith(self.V2_MODELS) and scope["method"] == "POST":
                args = _model_and_version(path[len(self.V2_MODELS) :])
                if args is not None:
                    await self._answer(scope, receive, send, self.v2_infer, *args)
                    return
        await self.app(scope, receive, send)

    @staticmethod
    async def _answer(
        scope: Scope,
        receive: Receive,
        send: Send,
        handler: Callable[..., Awaitable[Response]],
        *args: str,
    ) -> None:
        request = Request(scope, receive)
        try:
            if scope["method"] != "POST":
                raise HTTPException(405, "Method Not Allowed", headers={"Allow": "POST"})
            response = await handler(request, *args)
        except ClientGone:
            return  # nobody to answer; the pipeline's calls were cancelled
        except Exception as exc:
            response = error_response(exc, request.state.request_id)
        await response(scope, receive, send)


def _model_and_version(rest: str) -> tuple[str, str] | None:
    """`{model}/infer` or `{model}/versions/{version}/infer` (each a non-empty segment)."""
    parts = rest.split("/")
    if parts[-1] != "infer" or not all(parts):
        return None
    if len(parts) == 2:
        return parts[0], ""
    if len(parts) == 4 and parts[1] == "versions":
        return parts[0], parts[2]
    return None
