"""What every v2 service does, free of gRPC: inference, metadata, readiness, Triton's
views of its models. The servicer (v2server/servicer.py) only translates calls to it."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from protos import codec, messages, pb, wire
from protos.codec import TensorLimits
from protos.errors import DeadlineExceeded, InvalidInput, NotFound, Unavailable
from v2server import triton
from v2server.model import Served, TensorSpec
from v2server.registry import Registry
from v2server.shm import SharedMemory
from v2server.validation import check_declared


def _tensor_metadata(specs: list[TensorSpec] | tuple[TensorSpec, ...]) -> list:
    return [
        pb.ModelMetadataResponse.TensorMetadata(name=s.name, datatype=s.datatype, shape=s.shape)
        for s in specs
    ]


class DataPlane:
    def __init__(
        self,
        registry: Registry,
        *,
        server_name: str,
        server_version: str,
        limits: TensorLimits = codec.DEFAULT_LIMITS,
        shared_memory: bool = False,
    ) -> None:
        self.registry = registry
        self.name = server_name
        self.version = server_version
        self.limits = limits
        self.shared = SharedMemory(enabled=shared_memory)
        self.draining = False
        """Set on shutdown: the server stays live but stops reporting ready."""

    # ------------------------------------------------------------ health and metadata

    def ready(self) -> bool:
        return self.registry.ready and not self.draining

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            model = self.registry.resolve(name, version)
        except (NotFound, Unavailable):
            return False
        return model.ready and not self.draining

    def server_metadata(self) -> pb.ServerMetadataResponse:
        extensions = [
            e for e in triton.EXTENSIONS if self.shared.enabled or e != "system_shared_memory"
        ]
        return pb.ServerMetadataResponse(
            name=self.name, version=self.version, extensions=extensions
        )

    def model_metadata(self, name: str, version: str = "") -> pb.ModelMetadataResponse:
        model = self.registry.resolve(name, version)
        return pb.ModelMetadataResponse(
            name=model.name,
            versions=self.registry.versions(model.name),
            platform=model.platform,
            inputs=_tensor_metadata(tuple(model.inputs)),
            outputs=_tensor_metadata(tuple(model.outputs)),
        )

    def model_config(self, name: str, version: str = "") -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(
            config=triton.model_config(self.registry.resolve(name, version))
        )

    def model_statistics(self, name: str = "", version: str = "") -> pb.ModelStatisticsResponse:
        models = self.registry.loaded(name, version)
        return pb.ModelStatisticsResponse(model_stats=[triton.model_statistics(m) for m in models])

    def repository_index(self, ready_only: bool) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for model in self.registry.loaded():
            ready = model.ready and not self.draining
            if ready or not ready_only:
                response.models.add(
                    name=model.name,
                    version=model.version,
                    state="READY" if ready else "UNAVAILABLE",
                    reason="" if ready else ("shutting down" if self.draining else "loading"),
                )
        return response

    # ------------------------------------------------------------ inference

    async def infer(self, request: wire.ParsedInferRequest, remaining: float | None) -> bytes:
        """One inference, serialized; `remaining`: seconds left of the caller's deadline."""
        arrived = time.perf_counter_ns()
        if self.draining:
            raise Unavailable("server is shutting down")
        if request.error:  # a message that does not parse has no model to charge
            raise InvalidInput(f"request does not parse: {request.error}")
        message = request.message
        model = self.registry.resolve(message.model_name, message.model_version)
        remaining = triton.with_request_timeout(message, remaining)
        try:
            # What each input declares, checked before any of it is decoded.
            declared = [(t.name, t.datatype, t.shape) for t in message.inputs]
            check_declared(model.name, model.inputs, declared, model.scheduling.max_batch_size)
            inputs = messages.request_inputs(request, self.limits, self.shared.read)
            # Work past the caller's deadline is for nobody: a streamed request has no
            # call for gRPC to cancel, so the deadline is kept here for every request.
            async with asyncio.timeout(remaining):
                answer = await self._infer(model, inputs, message, remaining)
        except TimeoutError:
            model.statistics.request(False, time.perf_counter_ns() - arrived)
            raise DeadlineExceeded(f"model '{model.name}': deadline passed") from None
        except BaseException:
            model.statistics.request(False, time.perf_counter_ns() - arrived)
            raise
        model.statistics.request(True, time.perf_counter_ns() - arrived)
        return answer

    async def _infer(
        self,
        model: Served,
        inputs: dict[str, np.ndarray],
        message: pb.ModelInferRequest,
        remaining: float | None,
    ) -> bytes:
        wanted = _requested_outputs(model, message)
        # Checked before the model runs, like every other part of the request.
        refs = {o.name: messages.shared_ref(o.parameters, o.name) for o in message.outputs}
        deadline = None if remaining is None else asyncio.get_running_loop().time() + remaining
        outputs = await model.infer(inputs, deadline)
        if wanted is not None:
            outputs = {name: outputs[name] for name in wanted}
        shared = {}
        for requested in message.outputs:
            name = requested.name
            param = requested.parameters.get("classification")
            if param is not None and param.int64_param > 0:
                outputs[name] = triton.classify(outputs[name], param.int64_param, model.labels)
            ref = refs[name]
            if ref is not None:
                array = outputs.pop(name)
                self.shared.write(ref, name, codec.to_raw_view(np.asarray(array))[1])
                shared[name] = (array, ref)
        return messages.build_response_bytes(model.name, model.version, outputs, message.id, shared)


def _requested_outputs(model: Served, request: pb.ModelInferRequest) -> list[str] | None:
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
