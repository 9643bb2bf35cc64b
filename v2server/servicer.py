"""The v2 GRPCInferenceService: each RPC a translation to the data plane; streams and the
service's byte window are the only logic here, as they are transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from protos import pb, pb_grpc, wire
from protos.errors import Overloaded
from v2server.bytewindow import ByteWindow
from v2server.dataplane import DataPlane
from v2server.interceptors import CallScope, InFlight, error_status, request_id_of

STREAM_WINDOW = 128
"""Requests of one stream that may be running or answered but not yet sent; beyond
that the stream is not read, so a client that does not read its answers is held back by
gRPC's flow control instead of filling the server's memory."""

Context = aio.ServicerContext


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        plane: DataPlane,
        *,
        in_flight: InFlight | None = None,
        stream_window_bytes: int = 64 << 20,
        max_inflight_bytes: int = 1 << 30,
    ) -> None:
        self.plane = plane
        self._in_flight = in_flight or InFlight()
        self._stream_window_bytes = stream_window_bytes
        self._held = ByteWindow(max_inflight_bytes)
        """Bytes of inference requests this service holds (unary and streamed)."""

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context):
        return pb.ServerReadyResponse(ready=self.plane.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context):
        return pb.ModelReadyResponse(ready=self.plane.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context):
        return self.plane.server_metadata()

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context):
        return self.plane.model_metadata(request.name, request.version)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context):
        return self.plane.model_config(request.name, request.version)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Context):
        return self.plane.model_statistics(request.name, request.version)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Context):
        return self.plane.repository_index(request.ready)

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
        if not self._held.take(request.size):
            raise Overloaded(
                f"server holds {self._held.used >> 20} MiB of requests "
                f"(limit {self._held.limit >> 20} MiB); retry later"
            )
        try:
            return await self.plane.infer(request, context.time_remaining())
        finally:
            await self._held.give(request.size)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[wire.ParsedInferRequest], context: Context
    ) -> AsyncIterator[bytes]:
        """Every request of the stream runs as soon as it arrives and is answered when
        done; a failed one is answered with its error_message and the stream goes on."""
        stream_id = request_id_of(context)
        answers: asyncio.Queue[tuple[bytes, int] | None] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()
        window = asyncio.Semaphore(STREAM_WINDOW)
        stream_bytes = ByteWindow(self._stream_window_bytes)

        async def one(request: wire.ParsedInferRequest) -> None:
            request_id = request.id or stream_id
            with CallScope(self._in_flight, "ModelStreamInfer", request, request_id) as call:
                try:
                    body = await self.plane.infer(request, context.time_remaining())
                    answers.put_nowait((wire.stream_response(body), request.size))
                except Exception as exc:
                    call.code, text = error_status(exc, "ModelStreamInfer")
                    answers.put_nowait((_stream_error(request.message, text), request.size))

        async def read() -> None:
            try:
                async for request in requests:
                    # Not read on until there is room, in messages and in bytes: a sender
                    # that does not read its answers is held back by flow control.
                    await window.acquire()
                    await stream_bytes.wait_take(request.size)
                    await self._held.wait_take(request.size)
                    task = asyncio.create_task(one(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                while running:
                    await asyncio.wait(set(running))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await answers.get()) is not None:
                answer, size = item
                yield answer
                window.release()
                await stream_bytes.give(size)
                await self._held.give(size)
            await reader  # the caller's half-close or a broken stream surfaces here
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()
            await self._held.give(stream_bytes.used)  # what unsent answers still held


def _stream_error(request: pb.ModelInferRequest, text: str) -> bytes:
    about = pb.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    return pb.ModelStreamInferResponse(error_message=text, infer_response=about).SerializeToString()


SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def rpc_handler(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """The service's method handlers; inference uses the zero-copy wire codec."""
    handlers = {}
    for method in SERVICE.methods:
        if method.name == "ModelStreamInfer":
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                servicer.ModelStreamInfer,
                request_deserializer=wire.parse_infer_request,
                response_serializer=wire.serialize_response,
            )
            continue
        if method.name == "ModelInfer":
            deserialize, serialize = wire.parse_infer_request, wire.serialize_response
        else:
            deserialize = getattr(pb, method.input_type.name).FromString
            serialize = getattr(pb, method.output_type.name).SerializeToString
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=deserialize,
            response_serializer=serialize,
        )
    return grpc.method_handlers_generic_handler(SERVICE.full_name, handlers)
