"""The console: its page (static files shipped in the package, no CDN) and the two feeds it
polls, the last requests and the live latency percentiles (recent.py)."""

from __future__ import annotations

from pathlib import Path

from fastapi import Request, Response
from fastapi.responses import RedirectResponse
from pydantic import BaseModel, Field
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from proxy.doors import schemas
from proxy.doors.responses import json_response
from proxy.doors.route import Route
from proxy.engine.recent import TOTAL, WINDOW_S, Recent
from proxy.errors import Problem

PAGE = "/console"
ASSETS = Path(__file__).parent / "console_assets"
MAX_LIMIT = 1000


class AnsweredRequest(BaseModel):
    id: str
    pipeline: str
    status: str = Field(description="the HTTP status it was answered with (499: client left)")
    at: float = Field(description="when the proxy took it, Unix time in seconds")
    latency_ms: float
    cache: str | None
    partial: bool
    steps: list[schemas.StepReport]


class Percentiles(BaseModel):
    count: int
    p50_ms: float
    p99_ms: float


class LatencyReport(BaseModel):
    window_s: float
    pipelines: dict[str, dict[str, Percentiles]] = Field(
        description="pipeline -> step -> figures over the window (steps answered ok only)"
    )


class ConsoleEndpoints:
    def __init__(self, recent: Recent) -> None:
        self.recent = recent

    async def requests(self, request: Request) -> Response:
        """GET /v1/console/requests?limit=&pipeline=: the newest first."""
        query = request.query_params
        raw = query.get("limit", "50")
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
            raise Problem(400, f"limit must be a whole number from 1 to {MAX_LIMIT}, not {raw!r}")
        return json_response(
            {"requests": self.recent.last(int(raw), query.get("pipeline") or None)}
        )

    async def latency(self) -> Response:
        """GET /v1/console/latency."""
        return json_response({"window_s": WINDOW_S, "pipelines": self.recent.latency()})


async def to_page() -> Response:
    return RedirectResponse(f"{PAGE}/")


def routes(endpoints: ConsoleEndpoints) -> list[Route]:
    """The console's routes, in the proxy's table (routes.py); the page itself is mounted."""
    return [
        Route("GET", PAGE, to_page, {"include_in_schema": False}),
        Route(
            "GET",
            "/v1/console/requests",
            endpoints.requests,
            {
                "tags": ["console"],
                "summary": "The last requests this proxy process answered, with their steps",
                "response_model": dict[str, list[AnsweredRequest]],
                "responses": schemas.errors(400, 401),
                "openapi_extra": {
                    "parameters": [
                        {
                            "name": name,
                            "in": "query",
                            "required": False,
                            "description": description,
                            "schema": schema,
                        }
                        for name, description, schema in (
                            ("limit", "how many (default 50)", {"type": "integer"}),
                            ("pipeline", "only this pipeline's", {"type": "string"}),
                        )
                    ]
                },
            },
        ),
        Route(
            "GET",
            "/v1/console/latency",
            endpoints.latency,
            {
                "tags": ["console"],
                "summary": f"p50 and p99 of every step over the last {WINDOW_S:g} s ("
                f"'{TOTAL}': the whole request)",
                "response_model": LatencyReport,
                "responses": schemas.errors(401),
            },
        ),
    ]


POLICY = {
    # Only the proxy's own files and API: an injected script or style could not run, a
    # page could not frame the console, and nothing is fetched from elsewhere. Images are
    # the user's own upload (drawn from a blob) and the empty favicon (a data: URL).
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' blob: data:; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class Page(StaticFiles):
    """The page's files, each answered with the POLICY headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(POLICY)
        return response


def page() -> StaticFiles:
    """The page's files, served at PAGE/ (index.html at PAGE/)."""
    return Page(directory=ASSETS, html=True)
