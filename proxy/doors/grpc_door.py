"""The proxy's v2 gRPC door (PROXY_GRPC_PORT): every pipeline a v2 model on the server core
the services use, so tritonclient, perf_analyzer and the KServe clients call a whole
pipeline as they call one model (ModelInfer, ModelStreamInfer, metadata, statistics)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from grpc import aio

from proxy.doors import v2plane
from proxy.doors.middleware import key_matches
from proxy.doors.v2plane import ProxyPlane
from proxy.settings import ProxySettings
from proxy.state import ProxyState
from v2server.server import V2Server
from v2server.settings import ServerSettings

OPEN_METHODS = frozenset({"ServerLive", "ServerReady", "Check", "Watch"})
"""Served without the API key, like /healthz and /readyz (Check, Watch: grpc.health.v1)."""


class ApiKeyInterceptor(aio.ServerInterceptor):
    """PROXY_API_KEY on the gRPC door: metadata `x-api-key: <key>` or
    `authorization: Bearer <key>`, else UNAUTHENTICATED."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key.encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if details.method.rsplit("/", 1)[-1] in OPEN_METHODS:
            return await continuation(details)
        metadata = {k: v for k, v in details.invocation_metadata or ()}
        given = (_bytes(metadata.get("x-api-key")), _bytes(metadata.get("authorization")))
        if key_matches(self.api_key, *given):
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:
            return None

        async def refuse(request: object, context: aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong API key")

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(refuse)
        if handler.stream_unary is not None:  # ModelInfer (v2server/servicer.py)
            return grpc.stream_unary_rpc_method_handler(refuse)
        return grpc.stream_stream_rpc_method_handler(refuse)


def _bytes(value: str | bytes | None) -> bytes:
    if value is None:
        return b""
    return value.encode() if isinstance(value, str) else value


def grpc_door(
    state: ProxyState,
    port: int,
    plane: ProxyPlane | None = None,
    share_port: bool = False,
    host: str | None = None,
) -> V2Server:
    """The door's server (not started) on the v2 data plane the REST door serves too (built
    here when not given); `port` 0 picks a free one; `share_port`: one of several workers
    serving the same port; `host`: other than the proxy's (behind the front: loopback)."""
    s: ProxySettings = state.settings
    plane = plane or v2plane.build(state)
    settings = ServerSettings(
        host=host or s.host,
        port=port,
        grace_s=s.grpc_grace_s,
        linger_s=0.5,
        max_message_mb=s.max_message_mb,
        max_receive_mb=s.door_message_mb(),
        max_connections=s.grpc_max_connections,
        max_connection_idle_s=s.grpc_idle_s,
        handshake_timeout_s=s.head_timeout_s,
        max_inflight_mb=s.max_inflight_mb,
        log_level=s.log_level,
    )
    return V2Server(
        plane.registry,
        settings,
        server_name=plane.name,
        server_version=plane.version,
        interceptors=[ApiKeyInterceptor(s.api_key)] if s.api_key else [],
        share_port=share_port,
        plane=plane,
    )
