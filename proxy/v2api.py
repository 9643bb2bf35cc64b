"""The v2 REST protocol on the proxy: every pipeline as a v2 model (run here), and each
model any pipeline calls, forwarded over gRPC to the service that hosts it."""

from __future__ import annotations

import asyncio
import functools
import logging

from fastapi import Request, Response
from google.protobuf.json_format import MessageToDict
from grpc import aio

from protos import pb
from protos.errors import InvalidInput
from protos.version import VERSION
from proxy import v2json
from proxy.api import budget_s
from proxy.disconnect import until_disconnect
from proxy.endpoints import Target
from proxy.errors import http_status
from proxy.fresh import Fresh
from proxy.grpc_door import SERVER_NAME
from proxy.pipeline_models import PipelineFailed, PipelineModel
from proxy.problems import Problem, json_response
from proxy.runner import PipelineRunner
from proxy.state import ProxyState
from proxy.streams import CallFailed
from proxy.uploads import read_body
from v2server.model import TensorSpec
from v2server.validation import check_inputs

log = logging.getLogger(__name__)

EXTENSIONS = ["binary_tensor_data", "model_configuration"]

PARSE_IN_THREAD = 256 * 1024
"""Bodies larger than this are parsed in a worker thread."""


class V2Endpoints:
    def __init__(self, state: ProxyState) -> None:
        self.state = state
        runner = PipelineRunner(state)
        self.pipelines = {name: PipelineModel(plan, runner) for name, plan in state.plans.items()}
        models = state.models()
        # On /v2 a name means the pipeline when one bears it; a service's model of the same
        # name (someone else's server names its model `digits`) is still called by the
        # pipelines, just not forwarded under that name. Never a reason not to start.
        shadowed = sorted(set(models) & set(self.pipelines))
        if shadowed:
            log.info(
                "on /v2 these names mean the pipeline, not the service model a pipeline calls: %s",
                ", ".join(shadowed),
            )
        self.hosts = {m: a for m, a in models.items() if m not in self.pipelines}
        self._addresses = set(models.values())
        self.timeout_s = state.settings.v2_timeout_ms / 1000
        self.ready_timeout_s = state.settings.ready_timeout_ms / 1000
        self._ready = Fresh(self._servers_ready, state.settings.ready_cache_ms / 1000)
        self._inputs: dict[tuple[str, str, str], tuple[TensorSpec, ...] | None] = {}

    def host(self, model: str) -> str:
        address = self.hosts.get(model)
        if address is None:
            served = ", ".join(sorted([*self.pipelines, *self.hosts]))
            raise Problem(404, f"unknown model '{model}' (served: {served})")
        return address

    def pipeline(self, name: str, version: str) -> PipelineModel | None:
        """The pipeline of that name (None: a model's name); 404 for a version it lacks."""
        model = self.pipelines.get(name)
        if model is not None and version not in ("", model.version):
            raise Problem(404, f"pipeline '{name}' has no version '{version}' (it has 1)")
        return model

    async def server_metadata(self) -> Response:
        """GET /v2."""
        return json_response({"name": SERVER_NAME, "version": VERSION, "extensions": EXTENSIONS})

    async def ready(self) -> Response:
        """GET /v2/health/ready: every service any pipeline calls, asked at once (at most
        once per PROXY_READY_CACHE_MS, proxy/fresh.py)."""
        ready = await self._ready.get()
        return json_response({"ready": ready}, 200 if ready else 503)

    async def _servers_ready(self) -> bool:
        channels = self.state.channels
        checks = await asyncio.gather(
            *(channels.ready(a, None, self.ready_timeout_s) for a in self._addresses)
        )
        return all(ok for ok, _ in checks)

    async def metadata(self, model: str) -> Response:
        """GET /v2/models/{model}."""
        return await self._metadata(model, "")

    async def metadata_version(self, model: str, version: str) -> Response:
        """GET /v2/models/{model}/versions/{version}."""
        return await self._metadata(model, version)

    async def _metadata(self, model: str, version: str) -> Response:
        pipeline = self.pipeline(model, version)
        if pipeline is not None:
            return json_response(
                {
                    "name": model,
                    "versions": [pipeline.version],
                    "platform": pipeline.platform,
                    "inputs": _described(pipeline.inputs),
                    "outputs": _described(pipeline.outputs),
                }
            )
        try:
            meta = await self._service_metadata(self.host(model), model, version, self.timeout_s)
        except aio.AioRpcError as exc:
            raise _downstream(exc, model) from None
        body = MessageToDict(meta, preserving_proto_field_name=True)
        for key in ("inputs", "outputs"):
            for t in body.get(key, []):
                t["shape"] = [int(d) for d in t.get("shape", [])]
        return json_response(body)

    async def model_ready(self, model: str) -> Response:
        """GET /v2/models/{model}/ready."""
        return await self._model_ready(model, "")

    async def model_ready_version(self, model: str, version: str) -> Response:
        """GET /v2/models/{model}/versions/{version}/ready."""
        return await self._model_ready(model, version)

    async def _model_ready(self, model: str, version: str) -> Response:
        pipeline = self.pipeline(model, version)
        if pipeline is not None:
            return json_response({"name": model, "ready": pipeline.ready})
        address = self.host(model)
        ok, why = await self.state.channels.ready(address, model, self.ready_timeout_s)
        body = {"name": model, "ready": ok, **({"error": why} if why else {})}
        return json_response(body, 200 if ok else 503)

    async def _service_metadata(
        self, address: str, model: str, version: str, timeout: float
    ) -> pb.ModelMetadataResponse:
        """A forwarded model's ModelMetadata from its service; raises aio.AioRpcError."""
        request = pb.ModelMetadataRequest(name=model, version=version)
        return await self.state.channels.unary(
            address, "ModelMetadata", request, pb.ModelMetadataResponse, timeout
        )

    async def _forwarded_inputs(
        self, address: str, model: str, version: str
    ) -> v2json.Expected | None:
        """A forwarded model's declared inputs (its service's ModelMetadata, asked once), so
        that a request its shapes refuse is refused before it is decoded; None when the
        service cannot say now (it then judges the request itself)."""
        key = (address, model, version)
        if key not in self._inputs:
            try:
                meta = await self._service_metadata(address, model, version, self.ready_timeout_s)
            except aio.AioRpcError:
                return None
            # A server that declares no inputs (MLServer may not) leaves the check to itself.
            specs = tuple(TensorSpec(t.name, t.datatype, tuple(t.shape)) for t in meta.inputs)
            self._inputs[key] = specs or None
        specs = self._inputs[key]
        if specs is None:
            return None
        rows = await self.state.channels.batch_size(address, model, version, self.ready_timeout_s)
        return model, specs, rows

    async def infer(self, request: Request, model: str) -> Response:
        """POST /v2/models/{model}/infer."""
        return await self._infer(request, model, "")

    async def infer_version(self, request: Request, model: str, version: str) -> Response:
        """POST /v2/models/{model}/versions/{version}/infer."""
        return await self._infer(request, model, version)

    async def _infer(self, request: Request, model: str, version: str) -> Response:
        pipeline = self.pipeline(model, version)
        address = "" if pipeline is not None else self.host(model)
        loop = asyncio.get_running_loop()
        started = loop.time()
        settings = self.state.settings
        budget = (
            budget_s(request, pipeline.plan.pipeline.timeout_ms, settings.max_timeout_ms)
            if pipeline is not None
            else self.timeout_s
        )
        deadline = started + budget
        raw = await read_body(request, self.state.uploads, deadline)
        expected = (
            (model, pipeline.inputs, 0)
            if pipeline is not None
            else await self._forwarded_inputs(address, model, version)
        )
        parse = functools.partial(
            v2json.parse,
            raw,
            self.state.uploads.max_bytes,
            header_length=_header_length(request),
            expected=expected,
        )
        try:
            # A large body is parsed beside the event loop: decoding a long number list or
            # many BYTES elements once held it (and every other request) for 2-3 s.
            parsed = await asyncio.to_thread(parse) if len(raw) > PARSE_IN_THREAD else parse()
            if parsed.timeout_s is not None:
                deadline = min(deadline, started + parsed.timeout_s)
            if pipeline is not None:
                check_inputs(model, pipeline.inputs, parsed.inputs)
                _check_outputs(model, pipeline.outputs, parsed.outputs)
        except InvalidInput as exc:
            raise Problem(400, str(exc)) from None
        # The v2 `id` is echoed as given; downstream (message id, gRPC metadata, logs) the
        # proxy's sanitised request id travels instead: metadata must be short plain ASCII.
        try:
            if pipeline is not None:
                outputs = await until_disconnect(request, pipeline.infer(parsed.inputs, deadline))
                if parsed.outputs:
                    outputs = {name: outputs[name] for name in parsed.outputs}
                version = pipeline.version
            else:
                outputs = await until_disconnect(
                    request,
                    self.state.channels.infer(
                        Target("", address, model, version),
                        parsed.inputs,
                        outputs=parsed.outputs,
                        timeout=max(deadline - loop.time(), 0.001),
                        request_id=request.state.request_id,
                    ),
                )
        except PipelineFailed as exc:
            raise exc.problem from None
        except CallFailed as exc:
            raise _downstream(exc, model) from None
        body, headers = v2json.answer(
            model, version, parsed.id or request.state.request_id, outputs, parsed.binary_outputs
        )
        return Response(body, headers=headers)


def _header_length(request: Request) -> int | None:
    raw = request.headers.get("inference-header-content-length")
    if raw is None:
        return None
    if not raw.isdigit():
        raise Problem(400, f"Inference-Header-Content-Length must be a byte count, not {raw!r}")
    return int(raw)


def _check_outputs(model: str, specs: tuple[TensorSpec, ...], asked: list[str]) -> None:
    names = {s.name for s in specs}
    for name in asked:
        if name not in names:
            raise InvalidInput(
                f"model '{model}' has no output '{name}' (it has {', '.join(sorted(names))})"
            )


def _described(specs: tuple[TensorSpec, ...]) -> list[dict[str, object]]:
    return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]


def _downstream(exc: aio.AioRpcError | CallFailed, model: str) -> Problem:
    return Problem(
        http_status(exc.code()), f"model '{model}': {exc.details()}", code=exc.code().name
    )
