"""The v2 REST protocol on the proxy: each model any pipeline calls, forwarded over gRPC
to the service that hosts it."""

from __future__ import annotations

import asyncio

from fastapi import Request, Response
from google.protobuf.json_format import MessageToDict
from grpc import aio

from protos import codec, pb
from protos.errors import InvalidInput
from proxy import v2json
from proxy.disconnect import until_disconnect
from proxy.endpoints import Target
from proxy.errors import http_status
from proxy.problems import Problem, json_response
from proxy.results import to_json
from proxy.state import ProxyState
from proxy.streams import CallFailed
from proxy.uploads import read_body


class V2Endpoints:
    def __init__(self, state: ProxyState) -> None:
        self.state = state
        self.hosts = state.models()
        self.timeout_s = state.settings.v2_timeout_ms / 1000
        self.ready_timeout_s = state.settings.ready_timeout_ms / 1000

    def host(self, model: str) -> str:
        address = self.hosts.get(model)
        if address is None:
            served = ", ".join(sorted(self.hosts))
            raise Problem(404, f"unknown model '{model}' (served: {served})")
        return address

    async def ready(self) -> Response:
        """GET /v2/health/ready: every service any pipeline calls, asked at once."""
        channels = self.state.channels
        checks = await asyncio.gather(
            *(channels.ready(a, None, self.ready_timeout_s) for a in set(self.hosts.values()))
        )
        ready = all(ok for ok, _ in checks)
        return json_response({"ready": ready}, 200 if ready else 503)

    async def metadata(self, model: str) -> Response:
        """GET /v2/models/{model}."""
        try:
            meta = await self.state.channels.unary(
                self.host(model),
                "ModelMetadata",
                pb.ModelMetadataRequest(name=model),
                pb.ModelMetadataResponse,
                self.timeout_s,
            )
        except aio.AioRpcError as exc:
            raise _downstream(exc, model) from None
        body = MessageToDict(meta, preserving_proto_field_name=True)
        for key in ("inputs", "outputs"):
            for t in body.get(key, []):
                t["shape"] = [int(d) for d in t.get("shape", [])]
        return json_response(body)

    async def model_ready(self, model: str) -> Response:
        """GET /v2/models/{model}/ready."""
        ok, why = await self.state.channels.ready(self.host(model), model, self.ready_timeout_s)
        body = {"name": model, "ready": ok, **({"error": why} if why else {})}
        return json_response(body, 200 if ok else 503)

    async def infer(self, request: Request, model: str) -> Response:
        """POST /v2/models/{model}/infer."""
        return await self._infer(request, model, "")

    async def infer_version(self, request: Request, model: str, version: str) -> Response:
        """POST /v2/models/{model}/versions/{version}/infer."""
        return await self._infer(request, model, version)

    async def _infer(self, request: Request, model: str, version: str) -> Response:
        address = self.host(model)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        raw = await read_body(request, self.state.uploads, deadline)
        try:
            parsed = v2json.parse(raw, self.state.uploads.max_bytes)
        except InvalidInput as exc:
            raise Problem(400, str(exc)) from None
        # The v2 `id` is echoed as given; downstream (message id, gRPC metadata, logs) the
        # proxy's sanitised request id travels instead: metadata must be short plain ASCII.
        try:
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
        except CallFailed as exc:
            raise _downstream(exc, model) from None
        return json_response(
            {
                "model_name": model,
                "model_version": version,
                "id": parsed.id or request.state.request_id,
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


def _downstream(exc: aio.AioRpcError | CallFailed, model: str) -> Problem:
    return Problem(
        http_status(exc.code()), f"model '{model}': {exc.details()}", code=exc.code().name
    )
