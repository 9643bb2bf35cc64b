"""The v2 REST door: each route a translation to the proxy's v2 data plane (v2plane.py), the
one the gRPC door serves too: pipelines as v2 models, and the models they call, forwarded.
Triton's HTTP extensions come with it: model configuration, statistics, the repository index,
classification and binary tensors."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable
from typing import TypeVar

import orjson
from fastapi import Request, Response

from protos.channels import STREAM_CANCEL_EXTENSION
from protos.codec import datatype_of
from protos.errors import MeshError
from protos.tracing import TRACE_EXTENSION
from protos.version import VERSION
from proxy.doors import v2answers, v2json
from proxy.doors.disconnect import until_disconnect
from proxy.doors.pipeline_bodies import budget_s
from proxy.doors.pipeline_models import PipelineFailed
from proxy.doors.responses import json_response
from proxy.doors.uploads import read_body
from proxy.doors.v2plane import SERVER_NAME, ProxyPlane
from proxy.engine.ledger import Ledger
from proxy.errors import Problem, http_status
from proxy.state import ProxyState
from v2server.dataplane import Inference, Requested

T = TypeVar("T")

BINARY_TENSORS = "binary_tensor_data"

PARSE_IN_THREAD = 256 * 1024
"""Bodies larger than this are parsed in a worker thread."""


def problem(exc: MeshError) -> Problem:
    """A data plane error as this door answers it: the status the table gives its code."""
    if isinstance(exc, PipelineFailed):
        # A copy: raised while `exc` is handled, the Problem's context becomes `exc`, which
        # holds the Problem itself; the two would be a cycle (with the request's upload in
        # their tracebacks' frames) that only a full collection frees.
        known = exc.problem
        return Problem(
            known.status,
            known.message,
            close=known.close,
            retry_after=known.retry_after,
            **known.extra,
        )
    return Problem(http_status(exc.code), str(exc), code=exc.code.name)


class V2Endpoints:
    def __init__(self, state: ProxyState, plane: ProxyPlane) -> None:
        self.state = state
        self.plane = plane
        # The gRPC door's own extension is not this door's; the binary tensors are only here.
        # The streams' own extensions: REST has no streams (its traces come in the header).
        streams_only = {STREAM_CANCEL_EXTENSION, TRACE_EXTENSION}
        self.extensions = sorted({*plane.extensions(), BINARY_TENSORS} - streams_only)

    async def server_metadata(self) -> Response:
        """GET /v2."""
        return json_response(
            {"name": SERVER_NAME, "version": VERSION, "extensions": self.extensions}
        )

    async def ready(self) -> Response:
        """GET /v2/health/ready: every service any pipeline calls, asked at once (at most
        once per PROXY_READY_CACHE_MS, fresh.py)."""
        ready = await self.plane.ready()
        return json_response({"ready": ready}, 200 if ready else 503)

    async def metadata(self, model: str, version: str = "") -> Response:
        """GET /v2/models/{model}[/versions/{version}]."""
        answer = await _asked(self.plane.model_metadata(model, version))
        return json_response(v2answers.message(answer))

    async def config(self, model: str, version: str = "") -> Response:
        """GET /v2/models/{model}[/versions/{version}]/config (Triton's model configuration)."""
        answer = await _asked(self.plane.model_config(model, version))
        return json_response(v2answers.message(answer.config, defaults=True))

    async def statistics(self, model: str = "", version: str = "") -> Response:
        """GET /v2/models[/{model}[/versions/{version}]]/stats (Triton's statistics)."""
        answer = await _asked(self.plane.model_statistics(model, version))
        return json_response(v2answers.message(answer, defaults=True))

    async def repository_index(self, request: Request) -> Response:
        """POST /v2/repository/index: `{"ready": true}` lists the ready models only."""
        deadline = asyncio.get_running_loop().time() + self.state.settings.v2_timeout_ms / 1000
        try:
            with self.state.engine.admission.ledger() as ledger:  # counts while it is read
                raw = await read_body(request, self.state.uploads, deadline, ledger)
                body = orjson.loads(raw) if raw.strip() else {}  # none: every model
        except ValueError:
            raise Problem(400, 'the body must be JSON, e.g. {"ready": true}') from None
        if not isinstance(body, dict) or not isinstance(body.get("ready", False), bool):
            raise Problem(400, "the body must be an object whose 'ready' is true or false")
        ready = body.get("ready", False)
        answer = await _asked(self.plane.repository_index(ready))
        return json_response(v2answers.message(answer).get("models", []))

    async def load(self, model: str) -> Response:
        """POST /v2/repository/models/{model}/load (Triton's repository extension), refused
        as the gRPC door refuses it: the pipelines come from the proxy's file, and a model
        is loaded by the service that serves it (its model control). Without the route,
        tritonclient.http's load_model read 404, as if the model were unknown."""
        await _asked(self.plane.load_model(model))
        return json_response({})

    async def unload(self, model: str) -> Response:
        """POST /v2/repository/models/{model}/unload, refused as `load`."""
        await _asked(self.plane.unload_model(model))
        return json_response({})

    async def model_ready(self, model: str, version: str = "") -> Response:
        """GET /v2/models/{model}[/versions/{version}]/ready."""
        try:
            ok = await self.plane.model_ready(model, version)
        except MeshError as exc:
            raise problem(exc) from None
        return json_response({"name": model, "ready": ok}, 200 if ok else 503)

    async def infer(self, request: Request, model: str, version: str = "") -> Response:
        """POST /v2/models/{model}[/versions/{version}]/infer."""
        # The body counts in the proxy's bytes in flight as it arrives, until the answer is
        # made: uncounted, 64 bodies of 17.7 MiB at once took it to 2 GiB.
        with self.state.engine.admission.ledger() as ledger:
            return await self._infer(request, model, version, ledger)

    async def _infer(self, request: Request, model: str, version: str, ledger: Ledger) -> Response:
        loop = asyncio.get_running_loop()
        started = loop.time()
        settings = self.state.settings
        # A pipeline's budget as on /v1 (X-Request-Timeout-Ms, capped); a forwarded call's
        # PROXY_V2_TIMEOUT_MS.
        plan = self.state.engine.plans[model] if self.plane.is_pipeline(model) else None
        budget = (
            budget_s(request, plan.pipeline.timeout_ms, settings.max_timeout_ms)
            if plan is not None
            else settings.v2_timeout_ms / 1000
        )
        deadline = started + budget
        signature = await _asked(self.plane.signature(model, version))
        raw = await read_body(request, self.state.uploads, deadline, ledger)
        expected = None if signature is None else (model, signature.inputs, signature.max_batch)
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
            inputs = parsed.inputs
            inference = Inference(
                model,
                version,
                [(name, datatype_of(a), a.shape) for name, a in inputs.items()],
                lambda: inputs,
                [Requested(n, parsed.classification.get(n, 0)) for n in parsed.outputs],
                max(deadline - loop.time(), 0.001),
                parsed.id or "",
            )
            answer = await until_disconnect(request, self.plane.run(inference))
        except MeshError as exc:
            raise problem(exc) from None
        body, headers = v2answers.answer(
            answer.model,
            answer.version,
            parsed.id or request.state.request_id,
            answer.outputs,
            parsed.binary_outputs,
            answer.parameters,
        )
        if "cache" in answer.parameters:
            headers["X-Cache"] = str(answer.parameters["cache"])
        return Response(body, headers=headers)


async def _asked(question: Awaitable[T]) -> T:
    """The data plane's answer; its error as this door answers it."""
    try:
        return await question
    except MeshError as exc:
        raise problem(exc) from None


def _header_length(request: Request) -> int | None:
    raw = request.headers.get("inference-header-content-length")
    if raw is None:
        return None
    if not raw.isdigit():
        raise Problem(400, f"Inference-Header-Content-Length must be a byte count, not {raw!r}")
    return int(raw)
