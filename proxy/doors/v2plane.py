"""The proxy's v2 data plane, behind its gRPC door and its REST door alike: the pipelines as
v2 models (v2server's data plane over a registry of them), and, unless PROXY_V2_MODELS is
`pipelines`, every model a pipeline calls, forwarded to the service that hosts it.

A forwarded model is answered by its service: metadata, configuration, statistics,
readiness and inference (requested outputs and classification included) are asked of it, and
its errors passed on with their own status and message. So both doors offer the same models,
extensions and errors. A pipeline bearing a model's name wins (someone else's server may name
its model `digits`): the pipelines still call that model, it is just not offered under the
name.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TypeVar

import grpc
import numpy as np
from grpc import aio

from protos import pb
from protos.codec import TensorLimits
from protos.errors import Downstream, NotFound
from protos.logs import REQUEST_ID, new_id
from protos.version import VERSION
from proxy.doors.pipeline_models import PipelineModel
from proxy.state import ProxyState
from proxy.transport.breaker import Breaker, Breakers
from proxy.transport.catalog import Catalog, Described
from proxy.transport.channels import Channels
from proxy.transport.failures import CallFailed
from proxy.transport.fresh import Fresh
from proxy.transport.services import Services
from proxy.transport.target import Target
from v2server.dataplane import Answer, DataPlane, Inference, Signature, requested_outputs
from v2server.model import TensorSpec
from v2server.registry import Registry
from v2server.validation import check_declared

T = TypeVar("T")

SERVER_NAME = "inference-mesh-proxy"

log = logging.getLogger(__name__)


class ProxyPlane(DataPlane):
    def __init__(
        self,
        pipelines: Registry,
        forwarded: Mapping[str, str],
        channels: Channels,
        services: Services,
        catalog: Catalog,
        *,
        addresses: Iterable[str],
        server_name: str,
        server_version: str,
        limits: TensorLimits,
        timeout_s: float,
        ready_timeout_s: float,
        ready_cache_s: float,
        breakers: Breakers | None = None,
    ) -> None:
        """`forwarded`: model name -> the address of the service that hosts it (a pipeline
        of the same name wins the name); `addresses`: every service a pipeline calls, whose
        readiness is the server's."""
        super().__init__(
            pipelines, server_name=server_name, server_version=server_version, limits=limits
        )
        self._pipelines = frozenset(pipelines.names())
        self.forwarded = {m: a for m, a in forwarded.items() if m not in self._pipelines}
        self.channels = channels
        self.services = services
        self.catalog = catalog
        self.timeout_s = timeout_s
        """A forwarded call's deadline when its caller set none (PROXY_V2_TIMEOUT_MS)."""
        self.ready_timeout_s = ready_timeout_s
        self._addresses = sorted(set(addresses))
        self._services_ready = Fresh(self._all_services_ready, ready_cache_s)
        self.breakers = breakers
        """The pipelines' record of endpoints not answering (breaker.py): a forwarded call
        to one fails at once, as the pipelines' calls do."""
        self._signatures: dict[tuple[str, str], tuple[Described, Signature | None]] = {}
        """A forwarded model's signature, and the catalog's answer it was made of."""
        self._versions: dict[str, list[str]] = {}

    # ------------------------------------------------------------ which model is where

    def names(self) -> list[str]:
        return sorted({*self._pipelines, *self.forwarded})

    def is_pipeline(self, name: str) -> bool:
        return name in self._pipelines

    def _address(self, name: str) -> str | None:
        """The service of a forwarded model; None for a pipeline; NotFound naming what is
        served for anything else."""
        address = self.forwarded.get(name)
        if address is None and name not in self._pipelines:
            raise NotFound(f"unknown model '{name}' (served: {', '.join(self.names())})")
        return address

    def _not_answering(self, address: str) -> Breaker | None:
        """The endpoint's breaker while its calls fail at once (breaker.py), else None."""
        breaker = None if self.breakers is None else self.breakers.get(address)
        return breaker if breaker is not None and breaker.refusing else None

    async def _ask(self, call: Callable[[], Awaitable[T]]) -> T:
        """A question to a service; its error passed on with its own status and message."""
        try:
            return await call()
        except aio.AioRpcError as exc:
            raise Downstream(exc.code(), exc.details() or exc.code().name) from None

    async def _unary(self, address: str, method: str, request, response_type):
        return await self._ask(
            lambda: self.channels.unary(address, method, request, response_type, self.timeout_s)
        )

    # ------------------------------------------------------------ health and metadata

    async def ready(self) -> bool:
        """Every service a pipeline calls answers ready (asked at most once per
        PROXY_READY_CACHE_MS, whoever asks). The pipelines themselves are ready once built
        (as a Triton ensemble stays ready while a model it calls is down)."""
        return not self.draining and await self._services_ready.get()

    async def _all_services_ready(self) -> bool:
        checks = await asyncio.gather(
            *(self.services.ready(a, None, self.ready_timeout_s) for a in self._addresses)
        )
        return all(ok for ok, _ in checks)

    async def model_ready(self, name: str, version: str = "") -> bool:
        address = self._address(name)
        if address is None:
            return await super().model_ready(name, version)
        ok, _ = await self.services.ready(address, name, self.ready_timeout_s)
        return ok

    async def model_metadata(self, name: str, version: str = "") -> pb.ModelMetadataResponse:
        address = self._address(name)
        if address is None:
            return await super().model_metadata(name, version)
        meta = await self._ask(
            lambda: self.services.metadata(address, name, version, self.timeout_s)
        )
        self._versions[name] = list(meta.versions)
        return meta

    async def model_config(self, name: str, version: str = "") -> pb.ModelConfigResponse:
        address = self._address(name)
        if address is None:
            return await super().model_config(name, version)
        request = pb.ModelConfigRequest(name=name, version=version)
        return await self._unary(address, "ModelConfig", request, pb.ModelConfigResponse)

    async def model_statistics(
        self, name: str = "", version: str = ""
    ) -> pb.ModelStatisticsResponse:
        if name:
            address = self._address(name)
            if address is None:
                return await super().model_statistics(name, version)
            request = pb.ModelStatisticsRequest(name=name, version=version)
            return await self._unary(
                address, "ModelStatistics", request, pb.ModelStatisticsResponse
            )
        response = await super().model_statistics()
        answers = await asyncio.gather(
            *(self.model_statistics(n) for n in self.forwarded), return_exceptions=True
        )
        for answer in answers:  # a service that cannot say now is left out, not an error
            if isinstance(answer, pb.ModelStatisticsResponse):
                response.model_stats.extend(answer.model_stats)
        return response

    async def repository_index(self, ready_only: bool) -> pb.RepositoryIndexResponse:
        response = await super().repository_index(ready_only)
        names = sorted(self.forwarded)
        checks = await asyncio.gather(
            *(self.services.ready(self.forwarded[n], n, self.ready_timeout_s) for n in names)
        )
        for name, (ok, why) in zip(names, checks, strict=True):
            if ok or not ready_only:
                versions = self._versions.get(name) or [""]
                response.models.add(
                    name=name,
                    version=versions[-1],
                    state="READY" if ok else "UNAVAILABLE",
                    reason=why,
                )
        return response

    async def signature(self, name: str, version: str = "") -> Signature | None:
        """A forwarded model's declared inputs and batch size, from the proxy's catalog of
        its service's metadata: a model reloaded with other inputs is judged by them within
        PROXY_CACHE_CHECK_MS. None when the service cannot say now (it then judges the
        request itself)."""
        address = self._address(name)
        if address is None:
            return await super().signature(name, version)
        if self._not_answering(address):
            return None  # not asked: `run` refuses the call at once
        described = await self.catalog.of(address, name, version)
        if described is None:
            return None
        key = (name, version)
        known = self._signatures.get(key)
        if known is not None and known[0] is described:
            return known[1]
        meta = described.meta
        self._versions[name] = list(meta.versions)
        specs = tuple(TensorSpec(t.name, t.datatype, tuple(t.shape)) for t in meta.inputs)
        outputs = tuple(TensorSpec(t.name, t.datatype, tuple(t.shape)) for t in meta.outputs)
        # The catalog asked the model's configuration too; a server without Triton's
        # extension has none, and its rows are then not checked here (0), as before.
        rows = max(0, described.config.max_batch_size) if described.config is not None else 0
        # A server that declares no inputs (MLServer may not) leaves the check to itself.
        signature = Signature(name, specs, rows, outputs) if specs else None
        self._signatures[key] = (described, signature)
        return signature

    # ------------------------------------------------------------ inference

    async def run(self, request: Inference) -> Answer:
        address = self._address(request.model)
        if address is None:
            return await super().run(request)
        if breaker := self._not_answering(address):
            raise Downstream(grpc.StatusCode.UNAVAILABLE, breaker.refuse())
        signature = await self.signature(request.model, request.version)
        if signature is not None:
            # Metadata cannot say which inputs are optional (Triton's config can): the service
            # judges a missing one; names, types, shapes and rows are checked here, undecoded.
            check_declared(
                request.model,
                signature.inputs,
                request.declared,
                signature.max_batch,
                complete=False,
            )
            if signature.outputs:
                requested_outputs(request.model, signature.outputs, request.requested)
        inputs = request.decode()
        target = Target("", address, request.model, request.version)
        timeout = self.timeout_s if request.remaining is None else request.remaining
        try:
            outputs: dict[str, np.ndarray] = await self.channels.infer(
                target,
                inputs,
                outputs=[r.name for r in request.requested],
                classification={r.name: r.classification for r in request.requested},
                timeout=max(timeout, 0.001),
                # The v2 `id` is echoed as given; downstream (message id, gRPC metadata,
                # logs) the door's sanitised request id travels: metadata is plain ASCII.
                request_id=REQUEST_ID.get() or new_id(),
            )
        except CallFailed as exc:
            raise Downstream(exc.code(), exc.details() or exc.code().name) from None
        versions = self._versions.get(request.model) or [""]
        return Answer(request.model, request.version or versions[-1], outputs)


def build(state: ProxyState) -> ProxyPlane:
    """The plane both v2 doors serve: the pipelines, and the models they call unless
    PROXY_V2_MODELS is `pipelines`."""
    s = state.settings
    engine = state.engine
    pipelines = [
        PipelineModel(plan, engine, s.max_timeout_ms, state.statistics[name])
        for name, plan in engine.plans.items()
    ]
    models = engine.models()
    shadowed = sorted(set(models) & set(engine.plans))
    if shadowed:
        log.info(
            "on the v2 doors these names mean the pipeline, not the model a pipeline calls: %s",
            ", ".join(shadowed),
        )
    return ProxyPlane(
        Registry.of(*pipelines, noun="pipeline"),
        {} if s.v2_models == "pipelines" else models,
        state.channels,
        state.services,
        state.catalog,
        addresses=models.values(),
        server_name=SERVER_NAME,
        server_version=VERSION,
        limits=TensorLimits(),
        timeout_s=s.v2_timeout_ms / 1000,
        ready_timeout_s=s.ready_timeout_ms / 1000,
        ready_cache_s=s.ready_cache_ms / 1000,
        breakers=engine.executor.calls.breakers,
    )
