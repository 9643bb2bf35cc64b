"""Every error answer the REST doors give, built in one place: `{"error": ..., "id": ...}`
plus what the situation adds (step, code, pipeline), with `Retry-After` where coming back
later helps and `Connection: close` where the connection cannot be trusted any more."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from proxy.errors import Problem

log = logging.getLogger("proxy")


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type="application/json",
        headers=dict(headers or {}),
    )


def problem_response(exc: Problem, request_id: str) -> Response:
    headers = {"X-Request-Id": request_id}
    if exc.retry_after is not None:
        headers["Retry-After"] = exc.retry_after
    if exc.close:
        headers["Connection"] = "close"
    return json_response({"error": exc.message, "id": request_id, **exc.extra}, exc.status, headers)


def error_response(exc: Exception, request_id: str) -> Response:
    """Any error as our JSON error shape: ours, Starlette's (unknown route, wrong method),
    or a bug (500; the traceback goes to the log)."""
    if isinstance(exc, Problem):
        return problem_response(exc, request_id)
    if isinstance(exc, StarletteHTTPException):
        response = problem_response(Problem(exc.status_code, str(exc.detail)), request_id)
        response.headers.update(exc.headers or {})
        return response
    log.error("unhandled error", exc_info=exc)
    return problem_response(Problem(500, "internal error (see the proxy log)"), request_id)
