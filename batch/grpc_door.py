"""`mesh batch --door grpc`: the batch over the proxy's gRPC door, on ModelStreamInfer
streams (the proxy's own multiplexed streams, proxy/transport/streams.py: one writer task a
stream, answers matched by id, a broken stream failing only the requests on it).

Each request asks for the pipeline's `result` output, /v1's result as JSON, and reads /v1's
`partial` and `steps` from the answer's parameters, so a row holds what the REST door would
have answered (less the proxy's own `latency_ms`). A failure's status is the REST door's
(the `http_status` the door puts beside the gRPC code), so retries follow the same rule."""

from __future__ import annotations

import math

import grpc
import numpy as np
import orjson
from grpc import aio

from batch.calls import Attempt, request_id
from batch.sources import Input
from protos import messages, pb, pb_grpc
from protos.channels import STREAM_CANCEL_EXTENSION, channel_options
from proxy.errors import http_status
from proxy.transport.failures import CallFailed
from proxy.transport.streams import StreamPool

PER_STREAM = 8
"""Requests in flight on one stream: 32 callers on 4 streams measured as fast as on more."""
RESULT = "result"


class DoorError(RuntimeError):
    """The door cannot run this batch (unreachable, no such pipeline, refused)."""


class GrpcDoor:
    def __init__(
        self,
        address: str,
        pipeline: str,
        concurrency: int,
        timeout_s: float,
        *,
        tls: bool = False,
        api_key: str | None = None,
    ) -> None:
        options = channel_options()
        self.channel = (
            aio.secure_channel(address, grpc.ssl_channel_credentials(), options=options)
            if tls
            else aio.insecure_channel(address, options=options)
        )
        self.address = address
        self.pipeline = pipeline
        self.timeout_s = timeout_s
        self.metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self.pool = StreamPool(
            self.channel, math.ceil(concurrency / PER_STREAM), metadata=self.metadata
        )
        self.input = "image"

    async def check(self) -> None:
        """The pipeline exists and takes an image; whether the door cancels a request on a
        stream when asked (it does: a request given up on stops running)."""
        stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        try:
            meta = await stub.ModelMetadata(
                pb.ModelMetadataRequest(name=self.pipeline), timeout=10, metadata=self.metadata
            )
            server = await stub.ServerMetadata(
                pb.ServerMetadataRequest(), timeout=10, metadata=self.metadata
            )
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                message = f"the mesh has no pipeline '{self.pipeline}' ({exc.details()})"
                raise DoorError(message) from None
            raise DoorError(
                f"the gRPC door at {self.address} answered {exc.code().name}: {exc.details()}"
            ) from None
        images = [t.name for t in meta.inputs if t.datatype == "BYTES"]
        if len(meta.inputs) != 1 or not images:
            raise DoorError(f"pipeline '{self.pipeline}' does not take one image")
        self.input = images[0]
        self.pool.cancels = STREAM_CANCEL_EXTENSION in server.extensions
        self.pool.learned.set()

    async def send(self, item: Input, data: bytes) -> Attempt:
        key = self.pool.key(request_id(item))
        request = messages.build_request_bytes(
            self.pipeline,
            {self.input: np.array([data], dtype=object)},
            request_id=key,
            outputs=[RESULT],
            timeout_us=int(self.timeout_s * 1e6),
        )
        try:
            # A little over the request's own timeout, which the door keeps: its answer
            # (DEADLINE_EXCEEDED, 504) comes back rather than a wait given up here.
            answer = await self.pool.pick().infer(key, request, self.timeout_s + 5.0)
        except CallFailed as exc:
            code = exc.code()
            if exc.http_status is not None:
                status: int | None = exc.http_status
            elif exc.stream or code == grpc.StatusCode.CANCELLED:
                status = None  # the stream broke: sent again, like a dropped connection
            else:
                status = http_status(code)
            error = {"status": status, "code": code.name, "error": exc.details()}
            return Attempt(status, error=error, retry_after="1" if status == 429 else None)
        outputs = messages.response_outputs(answer)
        about = answer.message.parameters
        return Attempt(
            200,
            result={
                "id": answer.message.id,
                "pipeline": self.pipeline,
                "result": orjson.loads(outputs[RESULT][0]),
                "partial": about["partial"].bool_param if "partial" in about else False,
                "steps": orjson.loads(about["steps"].string_param) if "steps" in about else [],
            },
        )

    async def close(self) -> None:
        await self.pool.close()
        await self.channel.close()
