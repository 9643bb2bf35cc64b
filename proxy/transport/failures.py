"""A call's failure as every transport reports it (streams.py, unary calls in channels.py)."""

from __future__ import annotations

import asyncio

import grpc


class CallFailed(Exception):
    """A call's failure with its gRPC status, on either transport (code() and details()
    like grpc.aio.AioRpcError, which the unary path raises)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        *,
        stream: bool = False,
        unfit: bool = False,
        resend: bool = False,
        http_status: int | None = None,
    ) -> None:
        super().__init__(details)
        self.http_status = http_status
        """The status the proxy's REST door gives the same failure, when the answer says
        (protos.channels.HTTP_STATUS_PARAMETER: the proxy's gRPC door)."""
        self._code = code
        self._details = details
        self.stream = stream
        """The stream itself failed (not one request on it)."""
        self.unfit = unfit
        """The server's streams do not carry many requests (StreamPool): call it unary,
        this request included (inference is idempotent)."""
        self.resend = resend
        """This request only is sent again, unary; the address stays on streams. The server
        ended the stream while it was written to before any of its streams had answered
        (maybe a server without streams whose UNIMPLEMENTED grpc.aio's failed write hid:
        "Internal error from Core"; StreamPool.unproven counts them), or ended a stream
        that had answered many with this request outstanding (a draining server)."""

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
"""Statuses a retry may fix: the endpoint is (re)starting or shutting down."""


class Expired(Exception):
    """A caller's own time ran out before its answer came (set by `expire`)."""


def expire(future: asyncio.Future) -> None:
    """A timer's callback that fails `future` with Expired: the same bound as
    asyncio.timeout for half its cost (~4 us against ~9), and no cancellation to tell apart
    from the caller's own."""
    if not future.done():
        future.set_exception(Expired())
