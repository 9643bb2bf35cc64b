"""The v2 GRPCInferenceService: translates protobuf <-> numpy and delegates."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np
from grpc import aio

from protos import codec, pb, pb_grpc, wire
from protos.codec import TensorLimits
from protos.errors import InvalidInput, NotFound, Overloaded, Unavailable
from v2server.bytewindow import ByteWindow
from v2server.interceptors import CallScope, InFlight, error_status, request_id_of
from v2server.model import ModelRepository, ServedModel, TensorSpec
from v2server.shm import SharedMemory
from v2server.statistics import Compute, Duration
from v2server.validation import check_inputs

STREAM_WINDOW = 128
"""Requests of one stream that may be running or answered but not yet sent; beyond
that the stream is not read, so a client that does not read its answers is held back by
gRPC's flow control instead of filling the server's memory."""

EXTENSIONS = ["classification", "model_configuration", "statistics", "system_shared_memory"]
"""Triton protocol extensions this server implements (ServerMetadata lists them)."""


def _tensor_metadata(specs: list[TensorSpec] | tuple[TensorSpec, ...]) -> list:
    return [
        pb.ModelMetadataResponse.TensorMetadata(name=s.name, datatype=s.datatype, shape=s.shape)
        for s in specs
    ]


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        repository: ModelRepository,
        *,
        server_name: str,
        server_version: str,
        limits: TensorLimits = codec.DEFAULT_LIMITS,
        shared_memory: bool = False,
        in_flight: InFlight | None = None,
        stream_window_bytes: int = 64 << 20,
        max_inflight_bytes: int = 1 << 30,
    ) -> None:
        self._repository = repository
        self._name = server_name
        self._version = server_version
        self._limits = limits
        self.draining = False
        """Set on shutdown: the server stays live but stops reporting ready."""
        self.shared = SharedMemory(enabled=shared_memory)
        self._in_flight = in_flight or InFlight()
        self._stream_window_bytes = stream_window_bytes
        self._held = ByteWindow(max_inflight_bytes)
        """Bytes of inference requests this service holds (unary and streamed)."""

    async def ServerLive(self, request: pb.ServerLiveRequest, context: aio.ServicerContext):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: aio.ServicerContext):
        return pb.ServerReadyResponse(ready=self._repository.ready and not self.draining)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: aio.ServicerContext):
        try:
            model = self._repository.resolve(request.name, request.version)
        except NotFound:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=model.ready and not self.draining)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: aio.ServicerContext):
        extensions = [e for e in EXTENSIONS if self.shared.enabled or e != "system_shared_memory"]
        return pb.ServerMetadataResponse(
            name=self._name, version=self._version, extensions=extensions
        )

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: aio.ServicerContext):
        model = self._repository.resolve(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=model.name,
            versions=self._repository.versions(model.name),
            platform=model.platform,
            inputs=_tensor_metadata(tuple(model.inputs)),
            outputs=_tensor_metadata(tuple(model.outputs)),
        )

    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(
            config=model_config(self._repository.resolve(request.name, request.version))
        )

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        models = self._loaded(request.name, request.version)
        return pb.ModelStatisticsResponse(model_stats=[model_statistics(m) for m in models])

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for model in self._loaded():
            ready = model.ready and not self.draining
            if ready or not request.ready:
                response.models.add(
                    name=model.name,
                    version=model.version,
                    state="READY" if ready else "UNAVAILABLE",
                    reason="" if ready else ("shutting down" if self.draining else "loading"),
                )
        return response

    def _loaded(self, name: str = "", version: str = "") -> list[ServedModel]:
        """The named version, every loaded version of `name`, or (no name) of every model;
        NotFound for unknown names and versions."""
        repo = self._repository
        if name and version:
            return [repo.resolve(name, version)]
        names = [name] if name else repo.names()
        return [repo.resolve(n, v) for n in names for v in repo.versions(n)]

    async def ModelInfer(
        self,
        request: pb.ModelInferRequest | wire.ParsedInferRequest,
        context: aio.ServicerContext,
    ) -> bytes:
        size = getattr(request, "size", 0)
        if not self._held.take(size):
            raise Overloaded(
                f"server holds {self._held.used >> 20} MiB of requests "
                f"(limit {self._held.limit >> 20} MiB); retry later"
            )
        try:
            return await self.answer(request, context.time_remaining())
        finally:
            await self._held.give(size)

    async def ModelStreamInfer(
        self,
        requests: AsyncIterator[wire.ParsedInferRequest],
        context: aio.ServicerContext,
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
                    body = await self.answer(request, context.time_remaining())
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

    async def answer(
        self, request: pb.ModelInferRequest | wire.ParsedInferRequest, remaining: float | None
    ) -> bytes:
        """One inference, serialized; `remaining`: seconds left of the caller's deadline."""
        arrived = time.perf_counter_ns()
        if self.draining:
            raise Unavailable("server is shutting down")
        # Decoded first: a message that does not parse has no model to charge.
        inputs = codec.request_inputs(request, self._limits, self.shared.read)
        message = request.message if isinstance(request, wire.ParsedInferRequest) else request
        model = self._repository.resolve(message.model_name, message.model_version)
        remaining = _with_request_timeout(message, remaining)
        try:
            answer = await self._infer(model, inputs, message, remaining)
        except BaseException:
            model.statistics.request(False, time.perf_counter_ns() - arrived)
            raise
        model.statistics.request(True, time.perf_counter_ns() - arrived)
        return answer

    async def _infer(
        self,
        model: ServedModel,
        inputs: dict[str, np.ndarray],
        message: pb.ModelInferRequest,
        remaining: float | None,
    ) -> bytes:
        check_inputs(model.name, model.inputs, inputs)
        wanted = _requested_outputs(model, message)
        # Checked before the model runs, like every other part of the request.
        refs = {o.name: codec.shared_ref(o.parameters, o.name) for o in message.outputs}
        deadline = None if remaining is None else asyncio.get_running_loop().time() + remaining
        outputs = await model.infer(inputs, deadline)
        if wanted is not None:
            outputs = {name: outputs[name] for name in wanted}
        shared = {}
        for requested in message.outputs:
            name = requested.name
            param = requested.parameters.get("classification")
            if param is not None and param.int64_param > 0:
                outputs[name] = classify(outputs[name], param.int64_param, model.labels)
            ref = refs[name]
            if ref is not None:
                array = outputs.pop(name)
                self.shared.write(ref, name, codec.to_raw_view(np.asarray(array))[1])
                shared[name] = (array, ref)
        return codec.build_response_bytes(model.name, model.version, outputs, message.id, shared)

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: aio.ServicerContext
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.shared.status(request.name):
            status = response.regions[region.name]
            status.name, status.key = region.name, region.key
            status.offset, status.byte_size = region.offset, region.byte_size
        return response

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: aio.ServicerContext
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.shared.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: aio.ServicerContext
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.shared.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()


_DATA_TYPES = {
    "BOOL": pb.TYPE_BOOL,
    "UINT8": pb.TYPE_UINT8,
    "UINT16": pb.TYPE_UINT16,
    "UINT32": pb.TYPE_UINT32,
    "UINT64": pb.TYPE_UINT64,
    "INT8": pb.TYPE_INT8,
    "INT16": pb.TYPE_INT16,
    "INT32": pb.TYPE_INT32,
    "INT64": pb.TYPE_INT64,
    "FP16": pb.TYPE_FP16,
    "FP32": pb.TYPE_FP32,
    "FP64": pb.TYPE_FP64,
    "BYTES": pb.TYPE_STRING,
}
"""v2 datatype -> Triton's model configuration DataType."""

_BACKENDS = {"onnxruntime_onnx": "onnxruntime"}


def model_config(model: ServedModel) -> pb.ModelConfig:
    """Triton's view of a model: with max_batch_size > 0 the dims leave out the batch one."""
    scheduling = model.scheduling
    skip = 1 if scheduling.max_batch_size else 0
    config = pb.ModelConfig(
        name=model.name,
        platform=model.platform,
        backend=_BACKENDS.get(model.platform, ""),
        max_batch_size=scheduling.max_batch_size,
        input=[
            pb.ModelInput(
                name=s.name,
                data_type=_DATA_TYPES.get(s.datatype, pb.TYPE_INVALID),
                dims=s.shape[skip:],
                optional=s.optional,
            )
            for s in model.inputs
        ],
        output=[
            pb.ModelOutput(
                name=s.name,
                data_type=_DATA_TYPES.get(s.datatype, pb.TYPE_INVALID),
                dims=s.shape[skip:],
            )
            for s in model.outputs
        ],
        instance_group=[
            pb.ModelInstanceGroup(
                name=model.name, kind=pb.ModelInstanceGroup.KIND_CPU, count=scheduling.instances
            )
        ],
    )
    if scheduling.max_queue_delay_s is not None:
        config.dynamic_batching.max_queue_delay_microseconds = round(
            scheduling.max_queue_delay_s * 1e6
        )
    return config


def _duration(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def model_statistics(model: ServedModel) -> pb.ModelStatistics:
    stats = model.statistics
    compute = stats.compute
    return pb.ModelStatistics(
        name=model.name,
        version=model.version,
        last_inference=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(stats.success),
            fail=_duration(stats.fail),
            queue=_duration(stats.queue),
            compute_input=_duration(compute.input),
            compute_infer=_duration(compute.infer),
            compute_output=_duration(compute.output),
        ),
        batch_stats=[_batch(rows, stats.batches[rows]) for rows in sorted(stats.batches)],
    )


def _batch(rows: int, compute: Compute) -> pb.InferBatchStatistics:
    return pb.InferBatchStatistics(
        batch_size=rows,
        compute_input=_duration(compute.input),
        compute_infer=_duration(compute.infer),
        compute_output=_duration(compute.output),
    )


def classify(scores: np.ndarray, k: int, labels: list[str] | None) -> np.ndarray:
    """Triton's classification extension: the top k of each row as BYTES
    "value:index" (or "value:index:label" when the model has labels)."""
    if scores.ndim not in (1, 2) or scores.dtype.kind != "f":
        raise InvalidInput(
            f"classification needs a float [N, C] or [C] output, got "
            f"{scores.dtype} {list(scores.shape)}"
        )
    rows = scores.reshape(-1, scores.shape[-1])
    k = min(k, rows.shape[1])
    top = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    out = np.empty(top.shape, dtype=object)
    for r, c in np.ndindex(top.shape):
        index = int(top[r, c])
        text = f"{rows[r, index]:f}:{index}"
        if labels is not None and index < len(labels):
            text += f":{labels[index]}"
        out[r, c] = text.encode()
    return out if scores.ndim == 2 else out[0]


SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def _with_request_timeout(request: pb.ModelInferRequest, remaining: float | None) -> float | None:
    """Triton's per-request `timeout` parameter (microseconds) shortens the call's deadline:
    a streamed request's only deadline besides the whole stream's."""
    param = request.parameters.get("timeout")
    kind = None if param is None else param.WhichOneof("parameter_choice")
    if kind is None:
        return remaining
    if kind != "int64_param" or param.int64_param < 0:
        raise InvalidInput("parameter 'timeout' must be a non-negative int64 (microseconds)")
    if param.int64_param == 0:
        return remaining
    own = param.int64_param / 1e6
    return own if remaining is None else min(own, remaining)


def _stream_error(request: pb.ModelInferRequest, text: str) -> bytes:
    about = pb.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    return pb.ModelStreamInferResponse(error_message=text, infer_response=about).SerializeToString()


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


def _requested_outputs(model: ServedModel, request: pb.ModelInferRequest) -> list[str] | None:
    if not request.outputs:
        return None
    known = {s.name for s in model.outputs}
    wanted = [o.name for o in request.outputs]
    for name in wanted:
        if name not in known:
            raise InvalidInput(
                f"model '{model.name}' has no output '{name}' (expected {', '.join(sorted(known))})"
            )
    return wanted
