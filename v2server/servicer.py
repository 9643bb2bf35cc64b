"""The v2 GRPCInferenceService: each RPC a translation to the data plane; streams and the
service's byte window are the only logic here, as they are transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from protos import pb, pb_grpc, wire
from protos.channels import (
    HTTP_STATUS_PARAMETER,
    STREAM_CANCEL_PARAMETER,
    STREAM_DRAINED_METADATA,
    STREAM_STATUS_PARAMETER,
)
from protos.errors import Overloaded
from protos.mailbox import Mailbox
from v2server.bytewindow import ByteWindow
from v2server.dataplane import DataPlane
from v2server.interceptors import (
    CallScope,
    InFlight,
    Refusal,
    answer_unary,
    error_status,
    request_id_of,
)

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
        max_message_bytes: int = 64 << 20,
        max_receive_bytes: int | None = None,
    ) -> None:
        self.plane = plane
        self._max_message = max_message_bytes
        self._streams: set[Mailbox[_Answer]] = set()
        """The answer queues of open streams (told when the server drains)."""
        self._in_flight = in_flight or InFlight()
        self._stream_window_bytes = stream_window_bytes
        self._held = ByteWindow(max_inflight_bytes)
        """Bytes of inference requests this service holds (unary and streamed)."""
        largest = max_message_bytes if max_receive_bytes is None else max_receive_bytes
        self._read_room = min(largest, max_inflight_bytes)
        """What a unary call takes from the window before its message is read."""

    def drain_streams(self) -> None:
        for answers in self._streams:
            answers.put_nowait(_DRAIN)

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

    async def ModelStreamInfer(
        self, requests: AsyncIterator[wire.ParsedInferRequest], context: Context
    ) -> AsyncIterator[bytes]:
        """Every request of the stream runs as soon as it arrives and is answered when
        done; a failed one is answered with its error_message and the stream goes on."""
        if self.plane.draining:
            # Refused like a unary call (the caller retries elsewhere): a stream that ended at
            # once with status OK and its request unread read as "no streams here" to callers.
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        stream_id = request_id_of(context)
        # (answer, bytes held); no answer for a request its sender cancelled.
        answers: Mailbox[_Answer] = Mailbox()
        running: set[asyncio.Task[None]] = set()
        by_id: dict[str, asyncio.Task[None]] = {}
        """The latest running request of each id (for cancellation)."""

        def done(task: asyncio.Task[None]) -> None:
            running.discard(task)
            key = task.get_name()
            if by_id.get(key) is task:
                del by_id[key]
            if self.plane.draining:
                answers.put_nowait(_DRAIN)  # wakes the writer to see whether it may end

        window = ByteWindow(STREAM_WINDOW)  # of messages: one "byte" each
        stream_bytes = ByteWindow(self._stream_window_bytes)

        async def one(request: wire.ParsedInferRequest) -> None:
            request_id = request.id or stream_id
            with CallScope(
                self._in_flight, "ModelStreamInfer", request, request_id, context
            ) as call:
                try:
                    body = await self.plane.infer(request, context.time_remaining())
                    if len(body) > self._max_message:
                        # gRPC would fail the whole stream: only this request fails.
                        raise Overloaded(
                            f"Sent message larger than max ({len(body)} vs. {self._max_message})"
                        )
                    answers.put_nowait((wire.stream_response(body), request.size))
                except asyncio.CancelledError:
                    call.code = grpc.StatusCode.CANCELLED
                    answers.put_nowait((None, request.size))
                    raise
                except Exception as exc:
                    call.code, text = error_status(exc, "ModelStreamInfer")
                    http = getattr(exc, "http_status", None)
                    error = _stream_error(request.message, text, call.code, http)
                    answers.put_nowait((error, request.size))
                finally:
                    request.release()

        waiting = 0
        """Requests read but not running yet (waiting for room): a draining stream must
        not end under them."""

        async def read() -> None:
            nonlocal waiting
            try:
                async for request in requests:
                    if _is_cancel(request):
                        if (task := by_id.get(request.id)) is not None:
                            task.cancel()
                        continue
                    # Not read on until there is room, in messages and in bytes: a sender
                    # that does not read its answers is held back by flow control.
                    waiting += 1
                    try:
                        await window.wait_take(1)
                        await stream_bytes.wait_take(request.size)
                        await self._held.wait_take(request.size)
                    finally:
                        waiting -= 1
                    task = asyncio.create_task(one(request), name=request.id)
                    running.add(task)
                    by_id[request.id] = task
                    task.add_done_callback(done)
                    # Not held while the stream waits for its next request: an OCR page is
                    # up to 20 MiB, and every idle stream kept its last one.
                    request = task = None  # type: ignore[assignment]
                while running:
                    await asyncio.wait(set(running))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        self._streams.add(answers)
        draining = False  # a stream opened while the server drains was refused above
        try:
            while True:
                if draining and not running and not waiting and not answers:
                    # Ends the call: the caller opens a new stream elsewhere.
                    context.set_trailing_metadata(((STREAM_DRAINED_METADATA, "1"),))
                    return
                item = await answers.get()
                if item is None:
                    break
                if item is _DRAIN:
                    draining = True
                    continue
                answer, size = item
                if answer is not None:
                    yield wire.Handed(answer)
                window.give(1)
                stream_bytes.give(size)
                self._held.give(size)
                item = answer = None  # nor its last answer (see read)
            await reader  # the caller's half-close or a broken stream surfaces here
        finally:
            self._streams.discard(answers)
            reader.cancel()
            for task in list(running):
                task.cancel()
            self._held.give(stream_bytes.used)  # what unsent answers still held


_Answer = tuple[bytes | None, int] | None
"""(answer, bytes held), or None once the stream's reader is done."""

_DRAIN = (None, -1)
"""Put in every open stream's answer queue when the server drains: each stream ends once
its running requests are answered, so that a graceful stop does not wait for idle streams
until its grace runs out."""


def _stream_error(
    request: pb.ModelInferRequest, text: str, code: grpc.StatusCode, http: int | None
) -> bytes:
    about = pb.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    about.parameters[STREAM_STATUS_PARAMETER].int64_param = code.value[0]
    if http is not None:
        about.parameters[HTTP_STATUS_PARAMETER].int64_param = http
    return pb.ModelStreamInferResponse(error_message=text, infer_response=about).SerializeToString()


def _is_cancel(request: wire.ParsedInferRequest) -> bool:
    param = request.message.parameters.get(STREAM_CANCEL_PARAMETER)
    return param is not None and param.bool_param


SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def rpc_handler(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """The service's method handlers; inference uses the zero-copy wire codec."""
    inference: dict = {"request_deserializer": wire.parse_infer_request}
    inference["response_serializer"] = wire.serialize_response
    handlers = {
        "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(
            servicer.ModelStreamInfer, **inference
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
