"""Calls larger than a model's batch or a message go in chunks; what cannot be split is
a 413 naming the limit."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from grpc import aio

from protos import pb
from proxy.errors import StepError
from proxy.transport import chunks
from proxy.transport.services import RECHECK_S, Services
from tests.proxy.scripted import ScriptedModel
from tests.proxy.test_pipelines import post
from v2server.model import Scheduling, TensorSpec


async def _rows(inputs, deadline):
    """x -> n rows of [1, 2, 3] * row index: the body says how many rows."""
    n = int(np.frombuffer(inputs["raw"].reshape(-1)[0], np.int32)[0])
    return {"x": (np.arange(n, dtype=np.float32)[:, None] * np.array([1, 2, 3], np.float32))}


def source() -> ScriptedModel:
    return ScriptedModel(
        "rows",
        _rows,
        inputs=(TensorSpec("raw", "BYTES", (-1,)),),
        outputs=(TensorSpec("x", "FP32", (-1, 3)),),
    )


def batching(max_batch: int) -> ScriptedModel:
    """y = x * 2, and `width`: as wide as the chunk has rows, up to 2 (a ragged output)."""
    seen: list[int] = []

    async def fn(inputs, deadline):
        x = inputs["x"]
        seen.append(len(x))
        return {"y": x * 2, "width": np.ones((len(x), min(len(x), 2)), np.float32)}

    model = ScriptedModel(
        "double",
        fn,
        inputs=(TensorSpec("x", "FP32", (-1, -1)), TensorSpec("z", "FP32", (-1, -1))),
        outputs=(TensorSpec("y", "FP32", (-1, -1)), TensorSpec("width", "FP32", (-1, -1))),
        scheduling=Scheduling(max_batch_size=max_batch),
    )
    model.seen = seen  # type: ignore[attr-defined]
    return model


PIPES = {
    "p": {
        "input": "raw",
        "steps": [
            {
                "call": {
                    "name": "rows",
                    "endpoint": "ROWS_URL",
                    "model": "rows",
                    "inputs": {"raw": "request.raw"},
                }
            },
            {
                "call": {
                    "name": "double",
                    "endpoint": "DOUBLE_URL",
                    "model": "double",
                    "inputs": {"x": "rows.x", "z": "rows.x"},
                }
            },
        ],
        "result": {"y": "double.y", "width": "double.width"},
    }
}


async def test_rows_beyond_the_batch_size_go_in_chunks(servers, make_client) -> None:
    model = batching(4)
    env = {"ROWS_URL": await servers(source()), "DOUBLE_URL": await servers(model)}
    async with make_client(PIPES, env) as client:
        r = await post(client, "p", np.array([10], np.int32).tobytes())
    assert r.status_code == 200, r.text
    assert sorted(model.seen) == [2, 4, 4]
    y = np.array(r.json()["result"]["y"])
    np.testing.assert_array_equal(y, np.arange(10)[:, None] * np.array([2, 4, 6]))
    assert np.array(r.json()["result"]["width"]).shape == (10, 2)


async def test_a_call_over_the_message_limit_is_split(servers, make_client) -> None:
    model = batching(100_000)
    env = {"ROWS_URL": await servers(source()), "DOUBLE_URL": await servers(model)}
    async with make_client(PIPES, env, max_message_mb=1) as client:
        # 60,000 rows of 12 bytes come back from `rows` (720 KB); `double` takes them twice
        r = await post(client, "p", np.array([60_000], np.int32).tobytes())
    assert r.status_code == 200, r.text[:300]
    assert len(model.seen) == 2 and sum(model.seen) == 60_000


async def test_what_cannot_be_split_is_413(servers, make_client) -> None:
    model = batching(0)  # does not batch: rows may not be split
    env = {"ROWS_URL": await servers(source()), "DOUBLE_URL": await servers(model)}
    async with make_client(PIPES, env, max_message_mb=1) as client:
        r = await post(client, "p", np.array([60_000], np.int32).tobytes())
    assert r.status_code == 413 and "Retry-After" not in r.headers
    assert r.json()["step"] == "double" and "does not batch" in r.json()["error"]
    assert model.seen == []


async def test_an_answer_over_the_message_limit_is_413_not_429(servers, make_client) -> None:
    env = {"ROWS_URL": await servers(source()), "DOUBLE_URL": await servers(batching(0))}
    pipes = {"p": {**PIPES["p"], "steps": PIPES["p"]["steps"][:1], "result": {"x": "rows.x"}}}
    async with make_client(pipes, env, max_message_mb=1) as client:
        r = await post(client, "p", np.array([200_000], np.int32).tobytes())  # 2.4 MB answer
    assert r.status_code == 413 and "Retry-After" not in r.headers
    assert "over the size limit" in r.json()["error"]


def test_chunks_of_a_ragged_output_are_padded_to_the_widest() -> None:
    joined = chunks._join([np.ones((2, 3)), np.ones((1, 1))])
    np.testing.assert_array_equal(joined, [[1, 1, 1], [1, 1, 1], [1, 0, 0]])


def test_a_single_row_too_large_is_named() -> None:
    big = {"x": np.zeros((2, 600_000), np.float32)}
    with pytest.raises(StepError) as info:
        chunks.plan(big, 8, 1 << 20, "s")
    assert info.value.http_status == 413 and "one row" in info.value.message


async def test_a_model_reloaded_with_a_smaller_batch_is_sent_what_it_takes(
    servers, make_client
) -> None:
    """A model's batch size was asked once and kept: a model reloaded to take fewer rows a
    call was sent chunks it refused, a 400 for every such request until the proxy
    restarted. A refused call now asks again, and is sent again in what the model takes."""
    model = batching(4)
    env = {"ROWS_URL": await servers(source()), "DOUBLE_URL": await servers(model)}
    async with make_client(PIPES, env, cache_check_ms=600_000) as client:  # no refresh
        before = await post(client, "p", np.array([10], np.int32).tobytes())
        model.scheduling = Scheduling(max_batch_size=3)  # reloaded: 3 rows a call
        model.seen.clear()  # type: ignore[attr-defined]
        await asyncio.sleep(RECHECK_S)  # a refusal asks again at most this often
        after = await post(client, "p", np.array([10], np.int32).tobytes())
    assert before.status_code == 200 and after.status_code == 200, after.text
    assert max(model.seen) == 3 and sum(model.seen[-4:]) == 10  # type: ignore[attr-defined]
    y = np.array(after.json()["result"]["y"])
    np.testing.assert_array_equal(y, np.arange(10)[:, None] * np.array([2, 4, 6]))


class _Configs:
    """A service's ModelConfig answers, counted."""

    def __init__(self) -> None:
        self.size, self.asked = 4, 0

    async def unary(self, address, method, request, response_type, timeout):
        self.asked += 1
        return pb.ModelConfigResponse(config=pb.ModelConfig(max_batch_size=self.size))


async def test_a_batch_size_is_asked_again_in_the_background() -> None:
    configs = _Configs()
    services = Services(configs, refresh_s=0.1)  # type: ignore[arg-type]
    assert await services.batch_size("a:1", "m", "", 1.0) == 4
    configs.size = 3
    assert await services.batch_size("a:1", "m", "", 1.0) == 4 and configs.asked == 1
    await asyncio.sleep(0.15)
    assert await services.batch_size("a:1", "m", "", 1.0) == 4, "nobody waits for it"
    await asyncio.sleep(0.01)
    assert await services.batch_size("a:1", "m", "", 1.0) == 3 and configs.asked == 2
    # A refused call asks at once (unless just asked): it waits for the answer.
    configs.size = 2
    await asyncio.sleep(RECHECK_S)
    assert await services.batch_size("a:1", "m", "", 1.0, recheck=True) == 2


class _Unsaid:
    """A server without Triton's ModelConfig (MLServer, KServe's model server)."""

    async def unary(self, address, method, request, response_type, timeout):
        raise aio.AioRpcError(
            grpc.StatusCode.UNIMPLEMENTED, grpc.aio.Metadata(), grpc.aio.Metadata(), "no"
        )


async def test_a_declared_batch_size_stands_in_for_a_server_that_cannot_say() -> None:
    """`<VARIABLE>_MAX_BATCH_SIZE` is taken where the server cannot say (0 without it: one
    request's call at a time); a server that says is taken at its word."""
    declared = {("a:1", "m", ""): 16, ("b:1", "m", ""): 16}
    services = Services(_Unsaid(), declared=declared)  # type: ignore[arg-type]
    assert await services.batch_size("a:1", "m", "", 1.0) == 16
    assert await services.batch_size("a:1", "other", "", 1.0) == 0
    assert await services.batch_size("a:1", "m", "2", 1.0) == 0  # another version
    saying = Services(_Configs(), declared=declared)  # type: ignore[arg-type]
    assert await saying.batch_size("b:1", "m", "", 1.0) == 4
