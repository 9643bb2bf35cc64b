"""The proxy's errors, shared by its three rooms (doors, engine, transport), and the one
table from gRPC status to HTTP status.

- Problem: an answer with an HTTP status and a message, raised wherever a request is refused
  (unknown pipeline, capacity, a body too large); every door turns it into its own error.
- StepError: a pipeline step failed; the step, the gRPC status and a safe message.
- ClientGone: the client left before its answer was ready.
- DefinitionError: a pipeline definition cannot be used (raised at start-up).
"""

from __future__ import annotations

from typing import Any

import grpc

from protos.errors import capped

GRPC_TO_HTTP: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    # Our own calls are only cancelled with their request, which then gets no answer at all;
    # a CANCELLED that reaches us came from a service shutting down.
    grpc.StatusCode.CANCELLED: 503,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""Anything else (INTERNAL, UNKNOWN, DATA_LOSS, ...) is a 502: the fault is downstream."""

RETRY_AFTER: dict[int, str] = {429: "1", 503: "1"}
"""Statuses that tell the client when to come back."""


def http_status(code: grpc.StatusCode) -> int:
    return GRPC_TO_HTTP.get(code, 502)


HTTP_TO_GRPC: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    # gRPC's own word for a message over the size limit.
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
"""The proxy's answers on its gRPC door: the status its REST door would give, as gRPC
says it (anything else is INTERNAL)."""


def grpc_code(http: int) -> grpc.StatusCode:
    return HTTP_TO_GRPC.get(http, grpc.StatusCode.INTERNAL)


class Problem(Exception):
    """An error answer: its HTTP status and a message naming the reason (the REST doors
    answer it as JSON, the gRPC door as the status HTTP_TO_GRPC gives)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        close: bool = False,
        retry_after: str | None = None,
        **extra: Any,
    ) -> None:
        message = capped(message)
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close
        """The client's connection is closed after the answer (e.g. a body left unread)."""
        self.retry_after = retry_after or RETRY_AFTER.get(status)
        """Seconds after which coming back may help (`Retry-After`), where the situation
        says better than RETRY_AFTER's default (a refusal for the work ahead: its wait)."""
        self.extra = extra

    @property
    def http_status(self) -> int:
        """As other errors name the REST status they stand for (the gRPC door's trailer)."""
        return self.status


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


class StepError(Exception):
    """A pipeline step failed; carries the step, the gRPC status and a safe message."""

    def __init__(
        self, step: str, code: grpc.StatusCode, message: str, http: int | None = None
    ) -> None:
        super().__init__(f"step '{step}': {message}")
        self.step = step
        self.code = code
        self.message = message
        self._http = http
        """Set where the gRPC status says less than the situation (a message over the
        size limit is RESOURCE_EXHAUSTED in gRPC, not a full queue: 413, not 429)."""

    @property
    def http_status(self) -> int:
        return self._http if self._http is not None else http_status(self.code)

    def problem(self, pipeline: str) -> Problem:
        """The failed step as every door answers it: its status, step, code and pipeline."""
        return Problem(
            self.http_status, str(self), step=self.step, code=self.code.name, pipeline=pipeline
        )


class DefinitionError(ValueError):
    """A pipeline definition cannot be used; raised at start-up with a clear message."""
