"""The v2 REST protocol on the proxy, forwarded over gRPC to the service hosting the model."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Path, Request, Response
from google.protobuf.json_format import MessageToDict
from grpc import aio

from protos import codec, pb
from protos.errors import InvalidInput
from proxy import schemas, v2json
from proxy.client import Channels
from proxy.definitions import Plan
from proxy.disconnect import until_disconnect
from proxy.errors import http_status
from proxy.problems import Problem, json_response
from proxy.results import to_json
from proxy.uploads import UploadLimits, read_body


def _models(plans: Mapping[str, Plan]) -> dict[str, str]:
    """Model name -> address of the first endpoint any pipeline uses for it."""
    hosts: dict[str, str] = {}
    for plan in plans.values():
        for target in plan.targets.values():
            hosts.setdefault(target.model, target.address)
    return hosts


def mount(
    app: FastAPI,
    plans: Mapping[str, Plan],
    channels: Channels,
    uploads: UploadLimits,
    timeout_s: float,
) -> None:
    hosts = _models(plans)
    # Documented, not enforced: an unknown model gets our 404 naming the served ones.
    model_path = Path(json_schema_extra={"enum": sorted(hosts)})

    def host(model: str) -> str:
        address = hosts.get(model)
        if address is None:
            raise Problem(404, f"unknown model '{model}' (served: {', '.join(sorted(hosts))})")
        return address

    def downstream(exc: aio.AioRpcError, model: str) -> Exception:
        return Problem(
            http_status(exc.code()), f"model '{model}': {exc.details()}", code=exc.code().name
        )

    @app.get(
        "/v2/health/live",
        tags=["v2"],
        response_model=schemas.Liveness,
        responses=schemas.errors(401),
    )
    async def v2_live() -> Response:
        return json_response({"live": True})

    @app.get(
        "/v2/health/ready",
        tags=["v2"],
        response_model=schemas.ServerReady,
        responses={503: {"model": schemas.ServerReady}, **schemas.errors(401)},
    )
    async def v2_ready() -> Response:
        checks = await asyncio.gather(*(channels.ready(a, None, 1.0) for a in set(hosts.values())))
        ready = all(ok for ok, _ in checks)
        return json_response({"ready": ready}, 200 if ready else 503)

    @app.get(
        "/v2/models/{model}",
        tags=["v2"],
        response_model=schemas.ModelMetadata,
        responses=schemas.errors(401, 404, 429, 501, 502, 503, 504),
    )
    async def v2_metadata(model: str = model_path) -> Response:
        try:
            meta = await channels.unary(
                host(model),
                "ModelMetadata",
                pb.ModelMetadataRequest(name=model),
                pb.ModelMetadataResponse,
                timeout_s,
            )
        except aio.AioRpcError as exc:
            raise downstream(exc, model) from None
        body = MessageToDict(meta, preserving_proto_field_name=True)
        for key in ("inputs", "outputs"):
            for t in body.get(key, []):
                t["shape"] = [int(d) for d in t.get("shape", [])]
        return json_response(body)

    @app.get(
        "/v2/models/{model}/ready",
        tags=["v2"],
        response_model=schemas.ModelReadiness,
        responses={503: {"model": schemas.ModelReadiness}, **schemas.errors(401, 404)},
    )
    async def v2_model_ready(model: str = model_path) -> Response:
        ok, why = await channels.ready(host(model), model, 1.0)
        return json_response(
            {"name": model, "ready": ok, **({"error": why} if why else {})}, 200 if ok else 503
        )

    async def _infer(model: str, version: str, request: Request) -> Response:
        address = host(model)
        deadline = asyncio.get_running_loop().time() + timeout_s
        raw = await read_body(request, uploads, deadline)
        try:
            parsed = v2json.parse(raw, uploads.max_bytes)
        except InvalidInput as exc:
            raise Problem(400, str(exc)) from None
        # The v2 `id` is echoed as given; downstream (message id, gRPC metadata, logs) the
        # proxy's sanitised request id travels instead: metadata must be short plain ASCII.
        request_id = parsed.id or request.state.request_id
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            outputs = await until_disconnect(
                request,
                channels.infer(
                    address,
                    model,
                    parsed.inputs,
                    version=version,
                    outputs=parsed.outputs,
                    timeout=max(remaining, 0.001),
                    request_id=request.state.request_id,
                ),
            )
        except aio.AioRpcError as exc:
            raise downstream(exc, model) from None
        return json_response(
            {
                "model_name": model,
                "model_version": version,
                "id": request_id,
                "outputs": [
                    {
                        "name": n,
                        "datatype": codec.datatype_of(a),
                        "shape": list(a.shape),
                        "data": to_json(a.reshape(-1)),
                    }
                    for n, a in outputs.items()
                ],
            }
        )

    infer_docs: dict[str, Any] = {
        "tags": ["v2"],
        "response_model": schemas.InferenceResponse,
        "responses": schemas.errors(400, 401, 404, 408, 413, 429, 501, 502, 503, 504),
        "openapi_extra": schemas.json_body(schemas.InferenceRequest),
    }

    @app.post("/v2/models/{model}/infer", **infer_docs)
    async def v2_infer(request: Request, model: str = model_path) -> Response:
        return await _infer(model, "", request)

    @app.post("/v2/models/{model}/versions/{version}/infer", **infer_docs)
    async def v2_infer_version(request: Request, version: str, model: str = model_path) -> Response:
        return await _infer(model, version, request)
