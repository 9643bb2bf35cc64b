"""What every v2 door does, free of the wire: inference, metadata, readiness, Triton's views of
its models (configuration, statistics, repository index, classification). The gRPC servicer
(v2server/servicer.py) and the proxy's REST door (proxy/doors/v2rest.py) only translate
calls to it; the proxy's doors extend it with the models its pipelines call, forwarded
(proxy/doors/v2plane.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from protos import codec, messages, pb, wire
from protos.codec import TensorLimits
from protos.errors import DeadlineExceeded, InvalidInput, NotFound, Unavailable, Unsupported
from v2server import triton
from v2server.deadline import within
from v2server.model import TensorSpec
from v2server.registry import Registry
from v2server.shm import SharedMemory
from v2server.validation import check_declared

if TYPE_CHECKING:  # a proxy imports this module, never model control (its metrics)
    from v2server.control import ModelControl

_NONE: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Requested:
    """An output a request asks for; `classification` > 0: its top k as Triton classifies."""

    name: str
    classification: int = 0


@dataclass(frozen=True)
class Signature:
    """What a model takes: checked against what a request declares before it is decoded."""

    model: str
    inputs: Sequence[TensorSpec]
    max_batch: int = 0
    outputs: Sequence[TensorSpec] = ()


@dataclass
class Inference:
    """One request, as every door hands it over."""

    model: str
    version: str
    declared: Sequence[tuple[str, str, Sequence[int]]]
    """Each input's name, datatype and shape, as the request says (checked first)."""
    decode: Callable[[], dict[str, np.ndarray]]
    """The input tensors, decoded once the declaration passed."""
    requested: Sequence[Requested] = ()
    """Outputs asked for; none: every output."""
    remaining: float | None = None
    """Seconds left of the caller's deadline."""
    id: str = ""


@dataclass
class Answer:
    model: str
    version: str
    outputs: dict[str, np.ndarray]
    parameters: dict[str, str | int | bool] = field(default_factory=dict)
    """The response's parameters (v2server.model.Outputs)."""


def _tensor_metadata(specs: Sequence[TensorSpec]) -> list:
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
        self.control: ModelControl | None = None
        """Loads and unloads models while the server runs (a service with a repository)."""

    # ------------------------------------------------------------ health and metadata

    async def ready(self) -> bool:
        return self.registry.ready and not self.draining

    async def model_ready(self, name: str, version: str = "") -> bool:
        try:
            model = self.registry.resolve(name, version)
        except (NotFound, Unavailable):
            return False
        return model.ready and not self.draining

    def extensions(self) -> list[str]:
        shm = self.shared.enabled
        listed = [e for e in triton.EXTENSIONS if shm or e != "system_shared_memory"]
        if self.control is not None and self.control.mode == "explicit":
            listed.append("model_repository")  # load and unload too, not only the index
        return listed

    async def server_metadata(self) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=self.name, version=self.version, extensions=self.extensions()
        )

    async def model_metadata(self, name: str, version: str = "") -> pb.ModelMetadataResponse:
        model = self.registry.resolve(name, version)
        return pb.ModelMetadataResponse(
            name=model.name,
            versions=self.registry.versions(model.name),
            platform=model.platform,
            inputs=_tensor_metadata(tuple(model.inputs)),
            outputs=_tensor_metadata(tuple(model.outputs)),
        )

    async def model_config(self, name: str, version: str = "") -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(
            config=triton.model_config(self.registry.resolve(name, version))
        )

    async def model_statistics(
        self, name: str = "", version: str = ""
    ) -> pb.ModelStatisticsResponse:
        models = self.registry.loaded(name, version)
        return pb.ModelStatisticsResponse(model_stats=[triton.model_statistics(m) for m in models])

    async def repository_index(self, ready_only: bool) -> pb.RepositoryIndexResponse:
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
        if self.control is not None and not ready_only:
            for name, why in sorted(self.control.reasons.items()):
                response.models.add(name=name, state="UNAVAILABLE", reason=why)
        return response

    async def load_model(self, name: str, parameters: Iterable[str] = ()) -> None:
        if self.control is None:
            raise Unsupported(f"{self.name} has no model repository to load models from")
        await self.control.load(name, parameters)

    async def unload_model(self, name: str) -> None:
        if self.control is None:
            raise Unsupported(f"{self.name} has no model repository to unload models from")
        await self.control.unload(name)

    async def signature(self, name: str, version: str = "") -> Signature | None:
        """The model's declared inputs (None: it declares none it can be held to)."""
        model = self.registry.resolve(name, version)
        return Signature(
            model.name, tuple(model.inputs), model.scheduling.max_batch_size, tuple(model.outputs)
        )

    # ------------------------------------------------------------ inference

    async def infer(self, request: wire.ParsedInferRequest, remaining: float | None) -> bytes:
        """One gRPC inference, serialized; `remaining`: seconds left of the caller's deadline."""
        if request.error:  # a message that does not parse has no model to charge
            raise InvalidInput(f"request does not parse: {request.error}")
        message = request.message
        remaining = triton.with_request_timeout(message, remaining)
        # Lists (sliced): a repeated field iterates until an IndexError, formatted each time.
        asked, given = message.outputs[:], message.inputs[:]
        # Checked before the model runs, like every other part of the request.
        refs = {o.name: messages.shared_ref(o.parameters, o.name) for o in asked}
        answer = await self.run(
            Inference(
                message.model_name,
                message.model_version,
                [(t.name, t.datatype, t.shape[:]) for t in given],
                lambda: messages.request_inputs(request, self.limits, self.shared.read),
                [Requested(o.name, _classification(o.parameters)) for o in asked],
                remaining,
                message.id,
            )
        )
        outputs, shared = answer.outputs, {}
        for name, ref in refs.items():
            if ref is not None:
                array = outputs.pop(name)
                self.shared.write(ref, name, codec.to_raw_view(np.asarray(array))[1])
                shared[name] = (array, ref)
        return messages.build_response_bytes(
            answer.model, answer.version, outputs, message.id, shared, answer.parameters
        )

    async def run(self, request: Inference) -> Answer:
        """One inference from any door: declared inputs checked, decoded, run within the
        deadline, requested outputs picked and classified; counted in the model's statistics."""
        arrived = time.perf_counter_ns()
        if self.draining:
            raise Unavailable("server is shutting down")
        model = self.registry.resolve(request.model, request.version)
        try:
            # What each input declares, checked before any of it is decoded.
            check_declared(
                model.name, model.inputs, request.declared, model.scheduling.max_batch_size
            )
            on_request = getattr(model, "on_request", _NONE)
            wanted = requested_outputs(model.name, model.outputs, request.requested, on_request)
            inputs = request.decode()
            # Work past the caller's deadline is for nobody: a streamed request has no
            # call for gRPC to cancel, so the deadline is kept here for every request.
            remaining = request.remaining
            if remaining is None:
                outputs = await model.infer(inputs, None)
            else:
                deadline = asyncio.get_running_loop().time() + remaining
                outputs = await within(model.infer(inputs, deadline), deadline)
        except TimeoutError:
            model.statistics.request(False, time.perf_counter_ns() - arrived)
            raise DeadlineExceeded(f"model '{model.name}': deadline passed") from None
        except BaseException:
            model.statistics.request(False, time.perf_counter_ns() - arrived)
            raise
        model.statistics.request(True, time.perf_counter_ns() - arrived)
        parameters = dict(getattr(outputs, "parameters", {}))
        return Answer(model.name, model.version, pick(outputs, wanted, model.labels), parameters)


def pick(
    outputs: dict[str, np.ndarray],
    wanted: Sequence[Requested] | None,
    labels: Mapping[str, list[str]],
) -> dict[str, np.ndarray]:
    """The outputs asked for (all when None; an output made on request, Outputs.on_demand,
    only when named), those asked with `classification` classified."""
    if wanted is None:
        return outputs
    picked = {}
    for asked in wanted:
        value = outputs[asked.name]
        if asked.classification > 0:
            value = triton.classify(value, asked.classification, labels.get(asked.name))
        picked[asked.name] = value
    return picked


def _classification(parameters: Mapping[str, pb.InferParameter]) -> int:
    param = parameters.get("classification")
    return param.int64_param if param is not None and param.int64_param > 0 else 0


def requested_outputs(
    model: str,
    specs: Sequence[TensorSpec],
    requested: Sequence[Requested],
    on_request: frozenset[str] = _NONE,
) -> list[Requested] | None:
    """The outputs asked for, each one the model has; None: all. `on_request`: outputs a
    model gives only when asked for by name (not in its metadata)."""
    if not requested:
        return None
    known = {s.name for s in specs} | on_request
    for asked in requested:
        if asked.name not in known:
            raise InvalidInput(
                f"model '{model}' has no output '{asked.name}' "
                f"(expected {', '.join(sorted(known))})"
            )
    return list(requested)
