"""The v2 GRPCInferenceService: each RPC a translation to the data plane; the service's
byte window and streams (streaming.py) are the only logic here, as they are transport."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from grpc import aio

from protos import pb, pb_grpc, wire
from protos.errors import Overloaded
from v2server.bytewindow import ByteWindow
from v2server.dataplane import DataPlane
from v2server.interceptors import InFlight, Refusal, answer_unary
from v2server.streaming import Streams

Context = aio.ServicerContext


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        plane: DataPlane,
        *,
        in_flight: InFlight | None = None,
        stream_window_bytes: int = 64 << 20,
        max_inflight_bytes: int = 1 << 30,
        max_message_bytes: int = 64 << 20,
        max_receive_bytes: int | None = None,
    ) -> None:
        self.plane = plane
        self._in_flight = in_flight or InFlight()
        self._held = ByteWindow(max_inflight_bytes)
        """Bytes of inference requests this service holds (unary and streamed)."""
        self.streams = Streams(
            plane, self._in_flight, self._held, stream_window_bytes, max_message_bytes
        )
        """ModelStreamInfer's calls (registered by `rpc_handler`)."""
        largest = max_message_bytes if max_receive_bytes is None else max_receive_bytes
        self._read_room = min(largest, max_inflight_bytes)
        """What a unary call takes from the window before its message is read."""

    def drain_streams(self) -> None:
        self.streams.drain()

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context):
        return pb.ServerReadyResponse(ready=await self.plane.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context):
        ready = await self.plane.model_ready(request.name, request.version)
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context):
        return await self.plane.server_metadata()

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context):
        return await self.plane.model_metadata(request.name, request.version)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context):
        return await self.plane.model_config(request.name, request.version)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Context):
        return await self.plane.model_statistics(request.name, request.version)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Context):
        return await self.plane.repository_index(request.ready)

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context: Context):
        await self.plane.load_model(request.model_name, request.parameters.keys())
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ):
        await self.plane.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Context
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.plane.shared.status(request.name):
            status = response.regions[region.name]
            status.name, status.key = region.name, region.key
            status.offset, status.byte_size = region.offset, region.byte_size
        return response

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Context
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.plane.shared.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Context
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.plane.shared.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def ModelInfer(self, request: wire.ParsedInferRequest, context: Context) -> bytes:
        """A unary call whose message is held already (the proxy's native front, where the
        proxy's own upload bound has counted it): refused when the window is full."""
        if not self._held.take(request.size):
            raise Overloaded(
                f"server holds {self._held.used >> 20} MiB of requests "
                f"(limit {self._held.limit >> 20} MiB); retry later"
            )
        try:
            return await self.plane.infer(request, context.time_remaining())
        finally:
            self._held.give(request.size)

    async def ModelInferRead(
        self, requests: AsyncIterator[wire.ParsedInferRequest], context: Context
    ) -> bytes:
        """ModelInfer as grpc.aio serves it: client-streaming (the same call on the wire), so
        that its message is read only once the window has room for the largest one, then
        holds its own size. Given a unary handler, gRPC had received every call that came
        together before any could be refused (40 of 18.9 MB: a recogniser bounded at 128 MB
        at 1.1 GB); unread, a call holds its lookahead (V2Server._build). Messages after a
        call's first are ignored."""
        reserved = self._read_room
        await self._held.wait_take(reserved)
        try:
            request = await context.read()
            if request is aio.EOF:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "ModelInfer sent no request")
            self._held.resize(reserved, request.size)
            reserved = request.size
            answer = await answer_unary(
                self._in_flight, "ModelInfer", self._infer, request, context
            )
            if isinstance(answer, Refusal):
                del request  # not held by the abort's traceback (interceptors.Refusal)
                await answer.abort(context)
            return answer
        finally:
            self._held.give(reserved)

    async def _infer(self, request: wire.ParsedInferRequest, context: Context) -> bytes:
        return await self.plane.infer(request, context.time_remaining())


SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def rpc_handler(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """The service's method handlers; inference uses the zero-copy wire codec."""
    inference: dict = {"request_deserializer": wire.parse_infer_request}
    inference["response_serializer"] = wire.serialize_response
    handlers = {
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
            servicer.streams.serve, **inference
        ),
        "ModelInfer": grpc.stream_unary_rpc_method_handler(servicer.ModelInferRead, **inference),
    }
    for method in SERVICE.methods:
        if method.name not in handlers:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                getattr(servicer, method.name),
                request_deserializer=getattr(pb, method.input_type.name).FromString,
                response_serializer=getattr(pb, method.output_type.name).SerializeToString,
            )
    return grpc.method_handlers_generic_handler(SERVICE.full_name, handlers)
