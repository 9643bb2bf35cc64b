"""The v2 REST protocol on the proxy, forwarded over gRPC to the service hosting the model."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Path, Request, Response
from google.protobuf.json_format import MessageToDict
from grpc import aio

from protos import codec, pb
from proxy import schemas
from proxy.client import Channels
from proxy.definitions import Plan
from proxy.errors import http_status
from proxy.results import to_json

TIMEOUT_S = 30.0


def _models(plans: Mapping[str, Plan]) -> dict[str, str]:
    """Model name -> address of the first endpoint any pipeline uses for it."""
    hosts: dict[str, str] = {}
    for plan in plans.values():
        for target in plan.targets.values():
            hosts.setdefault(target.model, target.address)
    return hosts


def _tensor(spec: Any, where: str, problem: type[Exception]) -> tuple[str, np.ndarray]:
    if not isinstance(spec, dict) or not {"name", "shape", "datatype", "data"} <= set(spec):
        raise problem(400, f"{where}: each input needs name, shape, datatype and data")
    name, shape, datatype = spec["name"], spec["shape"], spec["datatype"]
    if datatype not in codec.DATATYPE_TO_DTYPE or datatype == "FP16":
        raise problem(400, f"input '{name}': unsupported datatype {datatype!r} in JSON")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise problem(400, f"input '{name}': shape must be a list of non-negative integers")
    flat = np.array(spec["data"], dtype=object).reshape(-1)
    if flat.size != math.prod(shape):
        raise problem(400, f"input '{name}': {flat.size} values do not fill shape {shape}")
    try:
        if datatype == "BYTES":
            arr = np.array(
                [v.encode() if isinstance(v, str) else bytes(v) for v in flat], dtype=object
            )
        else:
            arr = flat.astype(codec.DATATYPE_TO_DTYPE[datatype])
    except (TypeError, ValueError, OverflowError):
        raise problem(400, f"input '{name}': data does not fit {datatype}") from None
    return name, arr.reshape(shape)


def mount(
    app: FastAPI,
    plans: Mapping[str, Plan],
    channels: Channels,
    json_response: Callable[..., Response],
    problem: type[Exception],
    max_bytes: int,
) -> None:
    hosts = _models(plans)
    # Documented, not enforced: an unknown model gets our 404 naming the served ones.
    model_path = Path(json_schema_extra={"enum": sorted(hosts)})

    def host(model: str) -> str:
        address = hosts.get(model)
        if address is None:
            raise problem(404, f"unknown model '{model}' (served: {', '.join(sorted(hosts))})")
        return address

    def downstream(exc: aio.AioRpcError, model: str) -> Exception:
        return problem(
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
                TIMEOUT_S,
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
        raw = await request.body()
        if len(raw) > max_bytes:
            raise problem(413, f"body exceeds the limit of {max_bytes} bytes")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise problem(400, f"body is not JSON: {exc}") from None
        if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
            raise problem(400, "body must be an object with an 'inputs' list")
        inputs = dict(_tensor(t, f"inputs[{i}]", problem) for i, t in enumerate(body["inputs"]))
        wanted = [o["name"] for o in body.get("outputs") or [] if isinstance(o, dict)]
        # The v2 `id` is echoed as given; downstream (message id, gRPC metadata, logs) the
        # proxy's sanitised request id travels instead: metadata must be short plain ASCII.
        request_id = str(body.get("id") or request.state.request_id)
        try:
            outputs = await channels.infer(
                address,
                model,
                inputs,
                version=version,
                outputs=wanted,
                timeout=TIMEOUT_S,
                request_id=request.state.request_id,
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
        "responses": schemas.errors(400, 401, 404, 413, 429, 501, 502, 503, 504),
        "openapi_extra": schemas.json_body(schemas.InferenceRequest),
    }

    @app.post("/v2/models/{model}/infer", **infer_docs)
    async def v2_infer(request: Request, model: str = model_path) -> Response:
        return await _infer(model, "", request)

    @app.post("/v2/models/{model}/versions/{version}/infer", **infer_docs)
    async def v2_infer_version(request: Request, version: str, model: str = model_path) -> Response:
        return await _infer(model, version, request)
