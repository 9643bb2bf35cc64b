"""The one place where service errors become gRPC statuses.

Every unary handler is wrapped (ModelInfer, served as a client-streaming handler, wraps
itself with the same `answer_unary`): MeshError -> its status and message; anything
else -> INTERNAL with a bare message (the traceback goes to the log, not to
the caller). The same wrapper records metrics and binds the request id.
Streamed inferences (ModelStreamInfer) answer each message on their own, with the
same statuses and messages (`error_status`), metrics and request id (`CallScope`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import grpc
from grpc import aio

from protos import tracing
from protos.channels import HTTP_STATUS_METADATA, PUSHBACK_METADATA
from protos.errors import MeshError
from protos.logs import REQUEST_ID, plain_id
from v2server import metrics
from v2server.spans import ServedSpan

log = logging.getLogger("v2server")

REQUEST_ID_KEY = "x-request-id"


def request_id_of(context: aio.ServicerContext) -> str:
    return _metadata(context, REQUEST_ID_KEY)


def _metadata(context: aio.ServicerContext, wanted: str) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == wanted:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return ""


TRACED = frozenset({"ModelInfer", "ModelStreamInfer"})
"""The calls with a span of their own (when traces are on)."""


def _traceparent(request: Any, context: aio.ServicerContext | None) -> str | None:
    """The caller's `traceparent`: a streamed request's parameter, or the call's metadata."""
    message = getattr(request, "message", request)
    parameters = getattr(message, "parameters", None)
    if parameters is not None and tracing.TRACEPARENT in parameters:
        return parameters[tracing.TRACEPARENT].string_param
    return _metadata(context, tracing.TRACEPARENT) if context is not None else None


def error_status(exc: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """The status and message a caller gets for an error. Ours carry their status and a
    message capped when made (protos.errors.capped: it may quote caller input, and gRPC
    refuses oversized trailers). Anything else is a bug: INTERNAL with a bare message, the
    traceback to the log (call it in `except`)."""
    if isinstance(exc, MeshError):
        return exc.code, exc.message
    log.exception("unhandled error in %s", method)
    return grpc.StatusCode.INTERNAL, "internal server error"


def error_trailers(exc: Exception) -> tuple[tuple[str, str], ...]:
    """A unary call's trailing metadata for its error: the REST door's status for it, and
    when to come back where the error says (`retry_after`, seconds, as REST's header)."""
    trailers: tuple[tuple[str, str], ...] = ()
    if (http := getattr(exc, "http_status", None)) is not None:
        trailers += ((HTTP_STATUS_METADATA, str(http)),)
    if (retry_after := getattr(exc, "retry_after", None)) is not None:
        trailers += ((PUSHBACK_METADATA, str(round(float(retry_after) * 1000))),)
    return trailers


class InFlight:
    """Calls (and streamed messages) being answered, for the graceful stop."""

    def __init__(self) -> None:
        self.count = 0
        self.last_answer = 0.0
        """time.monotonic() when the latest call ended (see V2Server.stop's linger)."""
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        if not self.count:
            self._idle.clear()
        self.count += 1

    def leave(self) -> None:
        self.count -= 1
        self.last_answer = time.monotonic()
        if self.count == 0:
            self._idle.set()

    async def drained(self) -> None:
        """Return once nothing is in flight."""
        await self._idle.wait()


class CallScope:
    """One answered request: binds its request id, counts it in flight, and records its
    status and latency when it ends (and its spans, v2server/spans.py). `code` is set by
    whoever maps the outcome."""

    def __init__(
        self,
        in_flight: InFlight,
        method: str,
        request: Any,
        request_id: str,
        context: aio.ServicerContext | None = None,
    ) -> None:
        self._in_flight = in_flight
        self._method = method
        self._request = request
        self._context = context
        given = request_id or getattr(request, "id", "") or ""
        self._request_id = plain_id(given) if given else ""
        self.code = grpc.StatusCode.OK
        self._span: ServedSpan | None = None

    def __enter__(self) -> CallScope:
        self._token = REQUEST_ID.set(self._request_id)
        self._start = time.perf_counter()
        self._in_flight.enter()
        if tracing.ENABLED and self._method in TRACED:
            message = getattr(self._request, "message", self._request)
            self._span = ServedSpan(
                self._method,
                message.model_name,
                message.model_version,
                _traceparent(self._request, self._context),
            )
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        exemplar = None
        if self._span is not None:
            exemplar = tracing.exemplar()
            self._span.end(self.code)
        model = getattr(self._request, "model_name", "") or getattr(self._request, "name", "")
        seconds = time.perf_counter() - self._start
        metrics.record(self._method, model, self.code, seconds, exemplar)
        REQUEST_ID.reset(self._token)
        self._in_flight.leave()


class ErrorMappingInterceptor(aio.ServerInterceptor):
    """Maps errors to gRPC statuses, records metrics, and counts calls in flight (for the
    graceful stop)."""

    def __init__(self, in_flight: InFlight) -> None:
        self.in_flight = in_flight

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
        in_flight = self.in_flight

        async def wrapped(request: Any, context: aio.ServicerContext) -> Any:
            answer = await answer_unary(in_flight, method, inner, request, context)
            if isinstance(answer, Refusal):
                del request  # not held by the abort's traceback (Refusal)
                await answer.abort(context)
            return answer

        return grpc.unary_unary_rpc_method_handler(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


async def answer_unary(
    in_flight: InFlight,
    method: str,
    inner: Callable[[Any, aio.ServicerContext], Awaitable[Any]],
    request: Any,
    context: aio.ServicerContext,
) -> Any:
    """One unary call's answer from `inner`, in its CallScope, or its error as a Refusal
    for the caller to send (also for ModelInfer, which reads its own message:
    v2server/servicer.py, ModelInferRead)."""
    with CallScope(in_flight, method, request, request_id_of(context), context) as call:
        try:
            return await inner(request, context)
        except asyncio.CancelledError:
            call.code = grpc.StatusCode.CANCELLED
            raise
        except aio.AbortError:
            call.code = context.code() or grpc.StatusCode.UNKNOWN
            raise
        except Exception as exc:
            call.code, text = error_status(exc, method)
            return Refusal(call.code, text, error_trailers(exc))


class Refusal:
    """A unary call's error, sent by `abort` from the frame that called answer_unary once it
    has let go of the request.

    Aborted, because a status set on the context and a handler that returns make grpc.aio
    send the call's headers before its status: a call whose headers came is committed, and
    the caller's gRPC retry policy never retries it (gRFC A6), whatever the status and its
    `grpc-retry-pushback-ms`. An abort sends the status alone (Trailers-Only). From that
    frame, because grpc.aio keeps the AbortError on the call's state, and the error's
    traceback holds the frames it left with their locals: a cycle only a full collection
    frees (19 refused 18 MiB images kept 340 MiB in the preprocessing)."""

    __slots__ = ("code", "text", "trailers")

    def __init__(
        self, code: grpc.StatusCode, text: str, trailers: tuple[tuple[str, str], ...]
    ) -> None:
        self.code, self.text, self.trailers = code, text, trailers

    async def abort(self, context: aio.ServicerContext) -> None:
        await context.abort(self.code, self.text, self.trailers)
