"""Request id, API key and the last line of error handling, as plain ASGI middleware
(Starlette's BaseHTTPMiddleware costs a task and a stream per request on the hot path)."""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from protos import tracing
from protos.logs import REQUEST_ID, plain_id
from proxy.doors import http_spans
from proxy.doors.responses import error_response, problem_response
from proxy.errors import ClientGone, Problem

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


CHALLENGE = 'Basic realm="inference-mesh", charset="UTF-8"'
"""Sent with a 401: a browser then asks for the key (any user name, the key as password)
and sends it with every later request of the page, its fetches included (the console)."""


def key_matches(expected: bytes, x_api_key: bytes, authorization: bytes) -> bool:
    """`X-API-Key: <key>`, `Authorization: Bearer <key>`, or HTTP Basic with the key as the
    password (HTTP headers or gRPC metadata)."""
    scheme, _, credentials = authorization.partition(b" ")
    match scheme.lower():
        case b"bearer":
            key = credentials
        case b"basic":
            key = _basic_password(credentials)
        case _:
            key = x_api_key
    return hmac.compare_digest(key, expected)


def _basic_password(credentials: bytes) -> bytes:
    try:
        return base64.b64decode(credentials.strip(), validate=True).partition(b":")[2]
    except binascii.Error:
        return b""


class RequestContext:
    """Give every request an id (a short, plain X-Request-Id is kept; anything else is
    replaced, since ids travel in gRPC metadata and logs), echo it in the answer, check
    the API key when one is configured, and answer any error that escaped the app in our
    shape: a bug becomes a 500 here, inside the server, so the connection stays usable
    for the client's next request (Starlette's outermost layer would re-raise it and
    uvicorn would drop the connection)."""

    def __init__(self, app: Callable, api_key: str | None, open_paths: set[str]) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        request_id = plain_id(headers.get(b"x-request-id", b""))
        scope.setdefault("state", {})["request_id"] = request_id
        id_header = (b"x-request-id", request_id.encode())
        if self.api_key is not None and scope["path"] not in self.open_paths:
            given = headers.get(b"x-api-key", b""), headers.get(b"authorization", b"")
            if not key_matches(self.api_key, *given):
                refusal = problem_response(Problem(401, "missing or wrong API key"), request_id)
                refusal.headers["WWW-Authenticate"] = CHALLENGE
                await refusal(scope, receive, send)
                return
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                # Error answers carry the id already (they are also made outside this layer).
                if not any(name.lower() == b"x-request-id" for name, _ in headers):
                    headers.append(id_header)
                message["headers"] = headers
                if span is not None:
                    http_spans.answered(span, message["status"])
            await send(message)

        token = REQUEST_ID.set(request_id)
        traced = tracing.NO_SPAN
        if tracing.ENABLED:
            traced = http_spans.request_span(scope, headers, request_id)
        with traced as span:
            try:
                await self.app(scope, receive, send_with_id)
            except ClientGone:
                pass  # nobody to answer
            except Exception as exc:
                if started:
                    raise  # half an answer went out: only closing the connection is honest
                await error_response(exc, request_id)(scope, receive, send_with_id)
            finally:
                REQUEST_ID.reset(token)
