"""What the proxy asks a service besides inference: whether it is ready, a model's metadata,
and whether the model batches (its max_batch_size, remembered and asked again every
`refresh_s`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import grpc
from grpc import aio

from protos import pb
from proxy.transport.breaker import Breaker
from proxy.transport.channels import RETRYABLE, Channels

RECHECK_S = 0.1
"""A refused call re-asks its model's batch size at most this often."""


class Services:
    def __init__(
        self,
        channels: Channels,
        refresh_s: float = float("inf"),
        declared: Mapping[tuple[str, str, str], int] | None = None,
    ) -> None:
        self.channels = channels
        self.refresh_s = refresh_s
        """How long a model's batch size is trusted before it is asked again (in the
        background: the calls go on with the one known meanwhile)."""
        self.declared = dict(declared or {})
        """(address, model, version) -> the batch size its endpoint's variable declares
        (`<VARIABLE>_MAX_BATCH_SIZE`), taken where the server cannot say one itself."""
        self._taken_as_declared: set[tuple[str, str, str]] = set()
        """The models whose batch size in use is the declared one (`as_declared`)."""
        self._batch_sizes: dict[tuple[str, str, str], tuple[int, float]] = {}
        """(address, model, version) -> (max_batch_size, when it was asked)."""
        self._refreshing: set[tuple[str, str, str]] = set()

    async def batch_size(
        self,
        address: str,
        model: str,
        version: str,
        timeout: float,
        breaker: Breaker | None = None,
        *,
        recheck: bool = False,
    ) -> int:
        """The model's max_batch_size from its ModelConfig (Triton's RPC, which our
        services answer): > 0 means rows are independent and may be sent in chunks. 0
        when it does not batch, or the server cannot say and its endpoint declares none
        (remembered; an unreachable server is asked again next time, and `breaker` hears it
        did not answer).

        Asked again every `refresh_s` without anyone waiting, so that a model reloaded with
        another batch size is followed; `recheck`: ask now and wait (a call sent in rows
        the model refused), unless it was asked within RECHECK_S."""
        key = (address, model, version)
        known = self._batch_sizes.get(key)
        if known is None:
            return await self._ask(key, timeout, breaker)
        size, at = known
        age = time.monotonic() - at
        if recheck and age >= RECHECK_S:
            return await self._ask(key, timeout, None)
        if age >= self.refresh_s and key not in self._refreshing:
            self._refreshing.add(key)
            task = asyncio.ensure_future(self._ask(key, timeout, None))
            task.add_done_callback(
                lambda t: self._refreshing.discard(key) or t.cancelled() or t.exception()
            )
        return size

    async def _ask(self, key: tuple[str, str, str], timeout: float, breaker: Breaker | None) -> int:
        address, model, version = key
        token = breaker.sending(model) if breaker is not None else 0
        try:
            await self.config(address, model, version, timeout)  # records the size
        except aio.AioRpcError as exc:
            if breaker is not None:
                breaker.missed(token, exc.code(), exc.details() or "", model)
            known = self._batch_sizes.get(key)
            if exc.code() in RETRYABLE or exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                if known is None:
                    return 0  # asked again next time
                self._batch_sizes[key] = (known[0], time.monotonic())  # and in refresh_s
                return known[0]
            size = self.declared.get(key, 0)  # it cannot say (no ModelConfig): as declared
            if size:
                self._taken_as_declared.add(key)
            self._batch_sizes[key] = (size, time.monotonic())
            return size
        except BaseException:
            if breaker is not None:
                breaker.forget(token)
            raise
        if breaker is not None:
            breaker.answered(token)
        return self._batch_sizes[key][0]

    async def ready(self, address: str, model: str | None, timeout: float) -> tuple[bool, str]:
        """(ready, why not) from ServerReady / ModelReady."""
        try:
            server = await self.channels.unary(
                address, "ServerReady", pb.ServerReadyRequest(), pb.ServerReadyResponse, timeout
            )
            if not server.ready:
                return False, "server not ready"
            if model:
                check = await self.channels.unary(
                    address,
                    "ModelReady",
                    pb.ModelReadyRequest(name=model),
                    pb.ModelReadyResponse,
                    timeout,
                )
                if not check.ready:
                    return False, f"model '{model}' not ready"
        except aio.AioRpcError as exc:
            return False, f"{exc.code().name}: {exc.details()}"
        return True, ""

    async def config(
        self, address: str, model: str, version: str, timeout: float
    ) -> pb.ModelConfigResponse:
        """The model's ModelConfig (Triton's extension); raises aio.AioRpcError."""
        request = pb.ModelConfigRequest(name=model, version=version)
        reply = await self.channels.unary(
            address, "ModelConfig", request, pb.ModelConfigResponse, timeout
        )
        # Whoever asked (the catalog every PROXY_CACHE_CHECK_MS, or batch_size's own
        # refresh), the batch size is known afresh: it is not asked again in its period.
        size = max(0, reply.config.max_batch_size)
        self._batch_sizes[(address, model, version)] = (size, time.monotonic())
        self._taken_as_declared.discard((address, model, version))
        return reply

    def as_declared(self, address: str, model: str, version: str) -> bool:
        """The model's batch size is its variable's word, not its server's."""
        return (address, model, version) in self._taken_as_declared

    async def metadata(
        self, address: str, model: str, version: str, timeout: float
    ) -> pb.ModelMetadataResponse:
        """The model's ModelMetadata; raises aio.AioRpcError."""
        request = pb.ModelMetadataRequest(name=model, version=version)
        return await self.channels.unary(
            address, "ModelMetadata", request, pb.ModelMetadataResponse, timeout
        )
