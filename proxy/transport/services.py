"""What the proxy asks a service besides inference: whether it is ready, a model's metadata,
and whether the model batches (its max_batch_size, remembered)."""

from __future__ import annotations

import grpc
from grpc import aio

from protos import pb
from proxy.transport.breaker import Breaker
from proxy.transport.channels import RETRYABLE, Channels


class Services:
    def __init__(self, channels: Channels) -> None:
        self.channels = channels
        self._batch_sizes: dict[tuple[str, str, str], int] = {}

    async def batch_size(
        self,
        address: str,
        model: str,
        version: str,
        timeout: float,
        breaker: Breaker | None = None,
    ) -> int:
        """The model's max_batch_size from its ModelConfig (Triton's RPC, which our
        services answer): > 0 means rows are independent and may be sent in chunks. 0
        when it does not batch or the server cannot say (remembered; an unreachable
        server is asked again next time, and `breaker` hears it did not answer)."""
        key = (address, model, version)
        if key not in self._batch_sizes:
            token = breaker.sending(model) if breaker is not None else 0
            try:
                reply = await self.channels.unary(
                    address,
                    "ModelConfig",
                    pb.ModelConfigRequest(name=model, version=version),
                    pb.ModelConfigResponse,
                    timeout,
                )
                self._batch_sizes[key] = max(0, reply.config.max_batch_size)
            except aio.AioRpcError as exc:
                if breaker is not None:
                    breaker.missed(token, exc.code(), exc.details() or "", model)
                if exc.code() in RETRYABLE or exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    return 0
                self._batch_sizes[key] = 0
            except BaseException:
                if breaker is not None:
                    breaker.forget(token)
                raise
            else:
                if breaker is not None:
                    breaker.answered(token)
        return self._batch_sizes[key]

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

    async def metadata(
        self, address: str, model: str, version: str, timeout: float
    ) -> pb.ModelMetadataResponse:
        """The model's ModelMetadata; raises aio.AioRpcError."""
        request = pb.ModelMetadataRequest(name=model, version=version)
        return await self.channels.unary(
            address, "ModelMetadata", request, pb.ModelMetadataResponse, timeout
        )
