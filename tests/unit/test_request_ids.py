"""Request ids reach logs only when short and plain (protos/logs.py): a door request `id`
of 20 MiB was once logged as it was and grew the log by 120 MiB; REST's X-Request-Id had the
rule already, the gRPC services and door now share it."""

from __future__ import annotations

import numpy as np
from grpc import aio

from protos import messages, pb_grpc
from protos.logs import REQUEST_ID, plain_id
from tests.proxy.scripted import ScriptedModel, serve


def test_plain_ids_are_kept_and_others_replaced() -> None:
    assert plain_id("req-1.2:3+4") == "req-1.2:3+4"
    assert plain_id(b"abc_DEF") == "abc_DEF"
    for bad in ("x" * 129, "a b", "", "é", "a\nb"):
        replaced = plain_id(bad)
        assert replaced != bad and len(replaced) == 32 and int(replaced, 16) >= 0


async def test_a_service_logs_a_huge_request_id_as_a_new_short_one() -> None:
    seen: list[str] = []

    async def fn(inputs, deadline):
        seen.append(REQUEST_ID.get())
        return {"y": inputs["x"]}

    server = await serve(ScriptedModel("m", fn))
    huge = "x" * (1 << 20)
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            x = {"x": np.ones((1, 2), np.float32)}
            for request_id in ("plain-1", huge):
                answer = await stub.ModelInfer(
                    messages.build_request("m", x, request_id=request_id)
                )
                assert answer.id == request_id  # the protocol echoes it to the caller
    finally:
        await server.stop(0)
    assert seen[0] == "plain-1"
    assert len(seen[1]) == 32 and seen[1] != huge
