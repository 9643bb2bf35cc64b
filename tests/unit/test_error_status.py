"""Errors reach callers the same way on unary calls and on streams: ours with their status
and a capped message, bugs as a bare INTERNAL."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from grpc import aio

from protos import messages, pb_grpc
from protos.errors import InvalidInput
from tests.proxy.scripted import ScriptedModel, serve


async def _bug(inputs, deadline):
    raise RuntimeError("secret detail")


async def _long_complaint(inputs, deadline):
    raise InvalidInput("x" * 5000)


async def test_unary_and_streamed_errors_map_alike() -> None:
    server = await serve(ScriptedModel("bug", _bug), ScriptedModel("long", _long_complaint))
    x = {"x": np.zeros((1, 2), np.float32)}
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            expected = {
                "bug": (grpc.StatusCode.INTERNAL, "internal server error"),
                "long": (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "x" * 1000 + "... (4,000 more characters)",
                ),
            }
            for model, (code, text) in expected.items():
                with pytest.raises(aio.AioRpcError) as info:
                    await stub.ModelInfer(messages.build_request(model, x), timeout=5)
                assert (info.value.code(), info.value.details()) == (code, text)
            requests = [messages.build_request(m, x, request_id=m) for m in expected]
            answers = [a async for a in stub.ModelStreamInfer(iter(requests), timeout=5)]
            got = {a.infer_response.id: a.error_message for a in answers}
            assert got == {model: text for model, (_, text) in expected.items()}
    finally:
        await server.stop(0)
