"""The one place where service errors become gRPC statuses.

Every unary handler is wrapped: MeshError -> its status and message; anything
else -> INTERNAL with a bare message (the traceback goes to the log, not to
the caller). The same wrapper records metrics and binds the request id.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from protos.errors import MeshError
from v2server import metrics
from v2server.logs import REQUEST_ID

log = logging.getLogger("v2server")

REQUEST_ID_KEY = "x-request-id"
MAX_MESSAGE = 1000


def _request_id(context: aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_KEY:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return ""


class ErrorMappingInterceptor(aio.ServerInterceptor):
    """Maps errors to gRPC statuses, records metrics, and counts calls in flight (for the
    graceful stop)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.last_answer = 0.0
        """time.monotonic() when the latest call ended (see V2Server.stop's linger)."""
        self._idle = asyncio.Event()
        self._idle.set()

    async def drained(self) -> None:
        """Return once no call is in flight."""
        await self._idle.wait()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        inner = handler.unary_unary

        async def wrapped(request: Any, context: aio.ServicerContext) -> Any:
            token = REQUEST_ID.set(_request_id(context) or getattr(request, "id", "") or "")
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            self.in_flight += 1
            self._idle.clear()
            try:
                return await inner(request, context)
            except MeshError as exc:
                code = exc.code
                # Messages may quote caller input; gRPC refuses oversized trailers.
                message = (
                    exc.message
                    if len(exc.message) <= MAX_MESSAGE
                    else (exc.message[:MAX_MESSAGE] + "... (truncated)")
                )
                await context.abort(exc.code, message)
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except aio.AbortError:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except Exception:
                code = grpc.StatusCode.INTERNAL
                log.exception("unhandled error in %s", method)
                await context.abort(grpc.StatusCode.INTERNAL, "internal server error")
            finally:
                # Unknown model names are caller input: keep them out of label values.
                model = getattr(request, "model_name", "") or getattr(request, "name", "")
                if code == grpc.StatusCode.NOT_FOUND:
                    model = ""
                metrics.REQUESTS.labels(method, model, code.name).inc()
                metrics.LATENCY.labels(method, model).observe(time.perf_counter() - start)
                REQUEST_ID.reset(token)
                self.in_flight -= 1
                self.last_answer = time.monotonic()
                if self.in_flight == 0:
                    self._idle.set()

        return grpc.unary_unary_rpc_method_handler(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
