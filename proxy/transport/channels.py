"""v2 gRPC calls from the proxy: one persistent channel per address, bytes forwarded.

Where a call goes (the address, a replica a name resolves to, one of several connections:
balancing.py decides) and how it travels (a stream of the address's pool, streams.py, or a
unary call) stay in one class: a replica's failure must reach the pick that chose it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal

import grpc
import numpy as np
from grpc import aio

from protos import messages, pb, tracing, wire
from protos.channels import METHOD_PREFIX, STREAM_CANCEL_EXTENSION, channel_options
from proxy.transport.balancing import CONNECTION, Replica, Replicas, names_replicas
from proxy.transport.failures import RETRYABLE, CallFailed
from proxy.transport.hedging import hedged
from proxy.transport.outgoing import Asked, request_bytes
from proxy.transport.streams import StreamPool
from proxy.transport.target import Target

log = logging.getLogger(__name__)

Infer = Callable[..., Awaitable[dict[str, np.ndarray]]]
"""Channels.infer's shape: (target, inputs, *, outputs, timeout, request_id)."""


class Channels:
    """The proxy's channels, created on first use and kept for its lifetime."""

    def __init__(
        self,
        max_message_mb: int = 64,
        credentials: grpc.ChannelCredentials | None = None,
        *,
        streams: int = 0,
        balance: Literal["proxy", "grpc"] = "proxy",
        resolve_interval_s: float = 10.0,
        connections: int = 1,
        keepalive_ms: int = 1000,
    ) -> None:
        self._channels: dict[str, aio.Channel] = {}
        self._balance = balance
        self._resolve_interval_s = resolve_interval_s
        self._connections = connections
        """Connections to each plain address (balancing.py)."""
        self._replicas: dict[str, Replicas] = {}
        """Names standing for replicas (balancing.py), when the proxy balances."""
        self._authority: dict[str, str] = {}
        """A replica's address -> the name it was resolved from (TLS checks the name)."""
        self.streams = streams
        """Streams per address (streams.py); 0: unary calls only."""
        self._pools: dict[str, StreamPool] = {}
        self._unary_only: set[str] = set()
        """Addresses whose server has no ModelStreamInfer."""
        self._credentials = credentials
        self.max_message = max_message_mb * 1024 * 1024
        self._options = [
            *channel_options(max_message_mb),
            # Reconnect quickly when a restarted service comes back.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            # A frozen or unreachable service is noticed by keepalive (PROXY_KEEPALIVE_MS).
            ("grpc.keepalive_time_ms", keepalive_ms),
            ("grpc.keepalive_timeout_ms", keepalive_ms),
            # This channel's own connections, not gRPC's process-wide pool: a channel made
            # anew to an address whose earlier server is gone would otherwise take over that
            # server's refused connection and its reconnect back-off (up to 1 s of refusals
            # for a service started again on the same port; seen in the tests).
            ("grpc.use_local_subchannel_pool", 1),
        ]

    def get(self, address: str) -> aio.Channel:
        """The channel to `address` (`host:port#i`: the i-th connection to host:port)."""
        channel = self._channels.get(address)
        if channel is None:
            key = address
            address = key.partition(CONNECTION)[0]
            options = list(self._options)  # a pool of its own: one connection each
            if self._balance == "grpc" and names_replicas(address):
                # Every call to the next address. Not for one address: pick_first reconnects
                # on the next call, round_robin only after its backoff.
                options += [("grpc.lb_policy_name", "round_robin")]
            if host := self._authority.get(address):
                options += [("grpc.default_authority", host)]
                if self._credentials is not None:
                    options += [("grpc.ssl_target_name_override", host)]
            channel = (
                aio.insecure_channel(address, options=options)
                if self._credentials is None
                else aio.secure_channel(address, self._credentials, options=options)
            )
            self._channels[key] = channel
        return channel

    def _state(self, address: str, connect: bool = False) -> grpc.ChannelConnectivity | None:
        channel = self._channels.get(address)
        return None if channel is None else channel.get_state(try_to_connect=connect)

    async def _route(self, target: str) -> tuple[str, Replicas | None, Replica | None]:
        """The address to call for `target`: itself, one of the replicas it names, or one
        of several connections to it."""
        if names_replicas(target):
            if self._balance != "proxy":
                return target, None, None
        elif self._connections == 1:
            return target, None, None
        replicas = self._replicas.get(target)
        if replicas is None:
            replicas = self._replicas[target] = Replicas(
                target, self._resolve_interval_s, self._state, self._connections
            )
        try:
            replica = await replicas.pick()
        except LookupError as exc:
            raise CallFailed(grpc.StatusCode.UNAVAILABLE, str(exc)) from None
        if replicas.host:
            self._authority.setdefault(replica.address, replicas.host)
        self._forget(replicas)
        return replica.address, replicas, replica

    def _forget(self, replicas: Replicas) -> None:
        """Close what the addresses a name no longer resolves to held, once idle."""
        for address in list(replicas.removed):
            if not any(address in r.addresses for r in self._replicas.values()):
                replicas.removed.remove(address)
                pool, channel = self._pools.pop(address, None), self._channels.pop(address, None)
                # Calls still in flight there hold their own references and finish first.
                task = asyncio.ensure_future(_close_later(pool, channel))
                task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self._pools.values()))
        self._pools.clear()
        await asyncio.gather(*(c.close() for c in self._channels.values()))
        self._channels.clear()

    def _pool(self, address: str) -> StreamPool:
        pool = self._pools.get(address)
        if pool is None:
            pool = self._pools[address] = StreamPool(self.get(address), self.streams)
            task = asyncio.ensure_future(self._learn_cancellation(address, pool))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return pool

    async def _learn_cancellation(self, address: str, pool: StreamPool) -> None:
        """Whether the service cancels streamed requests and reads their trace context."""
        try:
            request, answer = pb.ServerMetadataRequest(), pb.ServerMetadataResponse
            meta = await self._unary_at(address, "ServerMetadata", request, answer, 5.0)
            pool.cancels = STREAM_CANCEL_EXTENSION in meta.extensions
            pool.traces = tracing.TRACE_EXTENSION in meta.extensions
        finally:
            pool.learned.set()

    async def infer(
        self,
        target: Target,
        inputs: Mapping[str, np.ndarray],
        *,
        outputs: Sequence[str] = (),
        timeout: float,
        request_id: str,
        classification: Mapping[str, int] | None = None,
    ) -> dict[str, np.ndarray]:
        """One inference, on a stream or a unary call; raises CallFailed. Tensors stay as
        received bytes. `classification`: outputs asked as their top k (Triton's extension)."""
        address, replicas, replica = await self._route(target.address)
        asked = Asked(outputs, classification)
        if replicas is None or replica is None:
            return await self._infer(address, target, inputs, asked, timeout, request_id)

        async def send(to: Replica, seconds: float) -> dict[str, np.ndarray]:
            if replicas.host:
                self._authority.setdefault(to.address, replicas.host)
            return await self._infer(to.address, target, inputs, asked, seconds, request_id)

        return await hedged(replicas, replica, send, timeout)

    async def _infer(
        self,
        address: str,
        target: Target,
        inputs: Mapping[str, np.ndarray],
        outputs: Asked,
        timeout: float,
        request_id: str,
    ) -> dict[str, np.ndarray]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self.streams and address not in self._unary_only:
            pool = self._pool(address)
            key = pool.key(request_id)
            # The deadline travels with the request (Triton's timeout parameter): the
            # stream's own has none.
            timeout_us = max(1, int(timeout * 1e6))
            # A stream's metadata is the stream's: a request's trace context rides in it
            # (also before the metadata says whether it is read: unknown ones are ignored).
            traces = tracing.ENABLED and (pool.traces or not pool.learned.is_set())
            parent = tracing.traceparent() if traces else None
            request = request_bytes(target, inputs, outputs, key, timeout_us, parent)
            try:
                return await self._streamed(pool, key, request, timeout)
            except CallFailed as exc:
                unfit = exc.unfit or (exc.stream and exc.code() == grpc.StatusCode.UNIMPLEMENTED)
                if not (unfit or exc.resend):
                    raise
                # A server without streams, or whose streams carry one request: unary from
                # now on, this request sent again that way (what was learnt fails nothing);
                # CallFailed.resend: this request only.
                if unfit and address not in self._unary_only:
                    self._unary_only.add(address)
                    log.warning(
                        "%s: calls go unary from now on (%s)", address, pool.unfit or exc.details()
                    )
                # Sent again within the request's own budget, not a fresh one: the stream's
                # end may have come late (a server draining its last requests).
                timeout = deadline - loop.time()
                if timeout <= 0:
                    raise CallFailed(
                        grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
                    ) from None
        call = self.get(address).unary_unary(
            METHOD_PREFIX + "ModelInfer",
            request_serializer=wire.serialize_infer_request,
            response_deserializer=wire.parse_infer_response,
        )
        request = request_bytes(target, inputs, outputs, request_id)
        metadata: tuple[tuple[str, str], ...] = (("x-request-id", request_id),)
        if tracing.ENABLED and (parent := tracing.traceparent()) is not None:
            metadata += ((tracing.TRACEPARENT, parent),)
        try:
            # The loop's own timer too: gRPC's deadline alone answered late under load (the
            # old path's impatient 504s: p99 550-900 ms for budgets of 3-25 ms).
            async with asyncio.timeout(timeout):
                response = await call(request, timeout=timeout, metadata=metadata)
        except aio.AioRpcError as exc:
            raise CallFailed(exc.code(), exc.details() or exc.code().name) from None
        except TimeoutError:
            raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        return messages.response_outputs(response)

    async def _streamed(
        self, pool: StreamPool, key: str, request: bytes, timeout: float
    ) -> dict[str, np.ndarray]:
        if len(request) > self.max_message:
            # Refused here: over the limit, gRPC would fail the whole stream, not one call.
            raise CallFailed(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(request)} vs. {self.max_message})",
            )
        response = await pool.pick().infer(key, request, timeout)
        return messages.response_outputs(response)

    async def unary(self, address: str, method: str, request, response_type, timeout: float):
        """Any other v2 RPC (metadata, health) with plain protobuf messages; raises
        aio.AioRpcError."""
        try:
            routed, replicas, replica = await self._route(address)
        except CallFailed as exc:
            metadata = aio.Metadata()
            raise aio.AioRpcError(exc.code(), metadata, metadata, exc.details()) from None
        try:
            return await self._unary_at(routed, method, request, response_type, timeout)
        except aio.AioRpcError as exc:
            if replicas and replica and exc.code() in RETRYABLE:
                replicas.failed(replica)
            raise

    async def _unary_at(self, address: str, method: str, request, response_type, timeout: float):
        """`unary` to this very address (a replica, a connection), not routed again."""
        call = self.get(address).unary_unary(
            METHOD_PREFIX + method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        return await call(request, timeout=timeout)


async def _close_later(pool: StreamPool | None, channel: aio.Channel | None) -> None:
    """A dropped replica's streams and channel, closed once its calls had time to end."""
    await asyncio.sleep(60.0)
    if pool is not None:
        await pool.close()
    if channel is not None:
        await channel.close()
