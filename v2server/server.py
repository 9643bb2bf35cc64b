"""Build, run and gracefully stop a v2 gRPC server around a model registry."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import uvloop
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protos import heap
from protos.channels import SERVICE_NAME
from protos.tls import TLSConfigError, server_credentials
from v2server import metrics
from v2server.dataplane import DataPlane
from v2server.interceptors import ErrorMappingInterceptor, InFlight
from v2server.metrics import BindError, serve_metrics
from v2server.model import LoadError
from v2server.registry import Registry
from v2server.servicer import InferenceServicer, rpc_handler
from v2server.settings import ServerSettings

if TYPE_CHECKING:  # a proxy imports this module, never model control (its metrics)
    from v2server.control import ModelControl

log = logging.getLogger("v2server")

LOOKAHEAD_BYTES = 1 << 20
"""What gRPC lets a caller send on one call before the service reads it (its HTTP/2 window
when bandwidth probing is off)."""


class V2Server:
    """A grpc.aio server hosting the v2 servicer and grpc.health.v1 for one registry."""

    def __init__(
        self,
        registry: Registry,
        settings: ServerSettings,
        *,
        server_name: str,
        server_version: str,
        interceptors: Sequence[aio.ServerInterceptor] = (),
        share_port: bool = False,
        plane: DataPlane | None = None,
        control: ModelControl | None = None,
    ) -> None:
        """`interceptors` run before the error mapping (e.g. the proxy's API key);
        `share_port`: several processes serve the port (the proxy's workers); `plane`: a data
        plane over `registry` that serves more than it (the proxy's forwarded models)."""
        self.settings = settings
        self.registry = registry
        self._in_flight = InFlight()
        self.plane = plane or DataPlane(
            registry,
            server_name=server_name,
            server_version=server_version,
            limits=settings.tensor_limits(),
            shared_memory=settings.shared_memory,
        )
        self.control = control
        self.plane.control = control
        self.servicer = InferenceServicer(
            self.plane,
            in_flight=self._in_flight,
            stream_window_bytes=int(settings.stream_window_mb * 2**20),
            max_inflight_bytes=int(settings.max_inflight_mb * 2**20),
            max_message_bytes=settings.max_message_mb * 2**20,
            max_receive_bytes=settings.max_receive_bytes(),
        )
        self.health: health.aio.HealthServicer | None = None
        self._server: aio.Server | None = None
        self._interceptors = [*interceptors, ErrorMappingInterceptor(self._in_flight)]
        self._share_port = share_port
        self.port = 0
        self.metrics_port: int | None = None

    @property
    def in_flight(self) -> InFlight:
        """Calls being answered, which the graceful stop waits for (also those a front hands
        to the servicer outside grpc.aio: proxy/doors/grpc_front.py)."""
        return self._in_flight

    def _build(self) -> aio.Server:
        """Create the grpc.aio server; it binds itself to the running event loop."""
        s = self.settings
        max_bytes = s.max_message_mb * 2**20
        options: list[tuple[str, int]] = [
            ("grpc.max_receive_message_length", s.max_receive_bytes()),
            ("grpc.max_send_message_length", max_bytes),
            ("grpc.server_handshake_timeout_ms", int(s.handshake_timeout_s * 1000)),
            ("grpc.max_concurrent_streams", s.max_concurrent_streams),
            # Linux lets two servers share a port by default; a second one must fail
            # unless sharing is meant.
            ("grpc.so_reuseport", int(self._share_port)),
            # Callers notice a frozen service by keepalive pings (the proxy: every second);
            # gRPC's default treats pings more often than every 5 minutes as abuse.
            ("grpc.http2.min_ping_interval_without_data_ms", 500),
            ("grpc.keepalive_permit_without_calls", 1),
            # A message is received only once the service reads it (the byte window): with
            # bandwidth probing on, gRPC widened the windows of calls not read yet and took
            # their messages all the same (40 of 19 MB unread: +700 MiB; off: +146 MiB).
            # Off, a call not read holds at most the lookahead; 1 MB keeps large messages as
            # fast as probing did at 1 ms of round trip (19 MB: 74 against 82 ms; 64 KB, the
            # default: 98 ms), at 10 ms 1.5x slower (bench/README, 2026-11-28, night).
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", LOOKAHEAD_BYTES),
        ]
        if s.max_connections is not None:
            options += [("grpc.max_allowed_incoming_connections", s.max_connections)]
        if s.max_connection_idle_s is not None:
            options += [("grpc.max_connection_idle_ms", int(s.max_connection_idle_s * 1000))]
        if (age := self.settings.max_connection_age_s) is not None:
            grace = self.settings.max_connection_age_grace_s
            options += [
                ("grpc.max_connection_age_ms", int(age * 1000)),
                ("grpc.max_connection_age_grace_ms", int(grace * 1000)),
            ]
        server = aio.server(interceptors=self._interceptors, options=options)
        server.add_generic_rpc_handlers((rpc_handler(self.servicer),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        return server

    async def start(self) -> int:
        """Bind, serve liveness at once, load the models, then report ready."""
        self.health = health.aio.HealthServicer()
        self._server = self._build()
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{self.settings.host}:{self.settings.port}"
        s = self.settings
        credentials = server_credentials(s.tls_cert, s.tls_key, s.tls_client_ca)
        if credentials is None:
            try:
                self.port = self._server.add_insecure_port(address)
            except RuntimeError:
                raise BindError(f"cannot serve gRPC on {address}: is the port in use?") from None
        else:
            try:
                self.port = self._server.add_secure_port(address, credentials)
            except RuntimeError:
                # grpc says only "failed to bind"; a free port means the pair was refused.
                raise TLSConfigError(
                    f"cannot serve TLS on {address} with tls_cert {s.tls_cert} and tls_key "
                    f"{s.tls_key}: is the key the certificate's, and the port free?"
                ) from None
        if self.port == 0:
            raise BindError(f"cannot serve gRPC on {address}: is the port in use?")
        await self._server.start()
        where = {"address": f"{self.settings.host}:{self.port}", "tls": credentials is not None}
        log.info("listening", extra={"fields": where})
        await self.registry.start()
        metrics.SERVED.update(self.registry.names())
        if self.control is not None:
            await self.control.start()
        if self.settings.metrics_port is not None:
            self.metrics_port = serve_metrics(self.settings.host, self.settings.metrics_port)
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if self.settings.port_file is not None:
            tmp = self.settings.port_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"grpc": self.port, "metrics": self.metrics_port}))
            tmp.replace(self.settings.port_file)
        log.info("ready", extra={"fields": {"models": self.registry.names()}})
        return self.port

    async def stop(self, grace: float | None = None) -> None:
        """Report not ready, refuse new calls, let in-flight calls finish, unload.

        grpc closes every connection once its own shutdown completes, even when a caller
        is still reading its answer (the caller then sees "connection reset"). So the
        service drains first, with the server still up and new calls refused (UNAVAILABLE),
        lingers until callers had time to read the last answers, and only then stops.
        """
        grace = self.settings.grace_s if grace is None else grace
        self.plane.draining = True
        self.servicer.drain_streams()
        if self.health is not None:
            await self.health.enter_graceful_shutdown()
        if self._server is not None:
            if grace > 0:
                started = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._in_flight.drained(), grace)
                since = time.monotonic() - self._in_flight.last_answer
                if since < self.settings.linger_s:
                    await asyncio.sleep(self.settings.linger_s - since)
                grace = max(0.0, grace - (time.monotonic() - started))
            await self._server.stop(grace)
        if self.control is not None:
            await self.control.stop()
        await self.registry.stop()
        self.plane.shared.close()
        log.info("stopped")


async def serve(server: V2Server) -> None:
    """Run until SIGTERM or SIGINT, then stop gracefully."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await server.start()
    except Exception:
        await server.stop(0)
        raise
    heap.settle()  # models loaded: the collector set for serving
    await stopping.wait()
    log.info("shutting down", extra={"fields": {"grace_s": server.settings.grace_s}})
    await server.stop()


def run_service(
    registry: Registry,
    settings: ServerSettings,
    *,
    server_name: str,
    server_version: str,
    control: ModelControl | None = None,
) -> int:
    """The body of every service's `main`: serve until SIGTERM; 2 on a configuration error."""
    server = V2Server(
        registry, settings, server_name=server_name, server_version=server_version, control=control
    )
    try:
        # uvloop, as the proxy runs (uvicorn's loop="uvloop"): grpc.aio takes any asyncio loop,
        # and on uvloop a service spent ~10% less CPU per call, c=1 p50 -5% (bench/README,
        # 2026-11-27, evening).
        uvloop.run(serve(server))
    except (TLSConfigError, LoadError, BindError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    return 0


__all__ = ["V2Server", "run_service", "serve"]
