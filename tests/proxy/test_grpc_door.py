"""The proxy's v2 gRPC door: pipelines as v2 models, against real gRPC services on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import numpy as np
import orjson
import pytest
import yaml
from grpc import aio

from protos import messages, pb, pb_grpc
from protos.errors import InvalidInput
from proxy.doors.grpc_door import grpc_door
from proxy.errors import DefinitionError
from proxy.settings import ProxySettings
from proxy.state import ProxyState
from tests.proxy.scripted import ScriptedModel, affine
from tests.proxy.test_pipelines import (
    body,
    call,
    parse_model,
    partial_fan_out,
    pipeline,
    post,
)
from v2server.model import TensorSpec

OUTPUTS = {
    "y": {"tensor": "b.y", "datatype": "FP32", "shape": [1, -1]},
    "first": {"tensor": "a.y", "datatype": "FP32", "shape": [-1, -1]},
}
PIPES = {
    "chain": pipeline(
        [call("a", "plus1", "parse"), call("b", "double", "a")],
        {"y": "b.y[0]"},
        outputs=OUTPUTS,
    ),
    "plain": pipeline([call("a", "plus1", "parse")], {"sum": "a.y[0]"}),
}


def image(raw: bytes, name: str = "chain", **parameters: int) -> pb.ModelInferRequest:
    tensor = np.array([raw], dtype=object)
    request = messages.build_request(name, {"raw": tensor})
    for key, value in parameters.items():
        request.parameters[key].int64_param = value
    return request


@pytest.fixture
def door(tmp_path: Path, servers) -> Callable:
    """A proxy's gRPC door (port 0) for pipelines and scripted services; yields a stub."""

    @asynccontextmanager
    async def start(
        pipes: dict, models: list[ScriptedModel], **settings
    ) -> AsyncIterator[pb_grpc.GRPCInferenceServiceStub]:
        env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(*models)}
        path = tmp_path / "pipelines.yaml"
        path.write_text(yaml.safe_dump({"pipelines": pipes}))
        state = ProxyState.build(ProxySettings(pipelines=path, **settings), env)
        server = grpc_door(state, 0)
        await server.start()
        channel = aio.insecure_channel(f"127.0.0.1:{server.port}")
        try:
            yield pb_grpc.GRPCInferenceServiceStub(channel)
        finally:
            await channel.close()
            await server.stop(0)
            await state.channels.close()

    return start


def chain_models(delay_s: float = 0.0) -> list[ScriptedModel]:
    return [affine("plus1", 1, 1, delay_s), affine("double", 2, 0)]


async def test_a_pipeline_is_a_v2_model(door) -> None:
    async with door(PIPES, chain_models()) as stub:
        answer = await stub.ModelInfer(image(body(1, 2)), timeout=5)
        meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="chain"), timeout=5)
        ready = await stub.ModelReady(pb.ModelReadyRequest(name="chain"), timeout=5)
        server = await stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=5)
        index = await stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=5)
        stats = await stub.ModelStatistics(pb.ModelStatisticsRequest(name="chain"), timeout=5)
    outputs = messages.response_outputs(answer)
    assert outputs["y"].tolist() == [[4.0, 6.0]] and outputs["y"].dtype == np.float32
    assert outputs["first"].tolist() == [[2.0, 3.0]]
    assert answer.model_name == "chain"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("raw", "BYTES", [1])]
    assert sorted((t.name, t.datatype, list(t.shape)) for t in meta.outputs) == [
        ("first", "FP32", [-1, -1]),
        ("y", "FP32", [1, -1]),
    ]
    assert ready.ready and server.name == "inference-mesh-proxy"
    # The pipelines, and the models they call (PROXY_V2_MODELS=all), forwarded.
    assert sorted(m.name for m in index.models) == ["chain", "double", "parse", "plain", "plus1"]
    assert {m.state for m in index.models} == {"READY"}
    assert stats.model_stats[0].inference_stats.success.count == 1


async def test_the_door_may_serve_the_pipelines_only(door) -> None:
    async with door(PIPES, chain_models(), v2_models="pipelines") as stub:
        index = await stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=5)
        with pytest.raises(aio.AioRpcError) as hidden:
            await stub.ModelMetadata(pb.ModelMetadataRequest(name="plus1"), timeout=5)
    assert sorted(m.name for m in index.models) == ["chain", "plain"]
    assert hidden.value.code() == grpc.StatusCode.NOT_FOUND
    assert "served: chain, plain" in (hidden.value.details() or "")


async def test_the_answer_is_the_same_as_v1s(door, servers, make_client, tmp_path) -> None:
    """Without declared outputs a pipeline answers one BYTES `result`: the /v1 result."""
    async with door(PIPES, chain_models()) as stub:
        answer = await stub.ModelInfer(image(body(5), "plain"), timeout=5)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(*chain_models())}
    async with make_client(PIPES, env) as client:
        v1 = (await post(client, "plain", body(5))).json()["result"]
    result = messages.response_outputs(answer)["result"]
    assert result.shape == (1,)
    assert yaml.safe_load(result[0]) == v1 == {"sum": [6.0]}


async def test_requested_outputs_and_streams(door) -> None:
    async with door(PIPES, chain_models()) as stub:
        request = image(body(1))
        request.outputs.add(name="first")
        only = messages.response_outputs(await stub.ModelInfer(request, timeout=5))

        async def requests():
            for i in range(5):
                r = image(body(i))
                r.id = f"r{i}"
                yield r

        streamed = [r async for r in stub.ModelStreamInfer(requests(), timeout=5)]
    assert list(only) == ["first"]
    assert [r.error_message for r in streamed] == [""] * 5
    by_id = {r.infer_response.id: messages.response_outputs(r.infer_response) for r in streamed}
    assert {k: v["y"].tolist() for k, v in by_id.items()} == {
        f"r{i}": [[2.0 * (i + 1)]] for i in range(5)
    }


async def test_errors_are_statuses_from_the_rest_table(door) -> None:
    async def picky(inputs, deadline):
        raise InvalidInput("x must be positive")

    models = [ScriptedModel("plus1", picky), affine("double", 2, 0)]
    async with door(PIPES, models) as stub:
        with pytest.raises(aio.AioRpcError) as bad_step:
            await stub.ModelInfer(image(body(1)), timeout=5)

        async def one():
            yield image(body(1))

        [streamed] = [r async for r in stub.ModelStreamInfer(one(), timeout=5)]
        with pytest.raises(aio.AioRpcError) as unknown:
            await stub.ModelInfer(image(body(1), "nope"), timeout=5)
        two = messages.build_request("chain", {"raw": np.array([b"a", b"b"], dtype=object)})
        with pytest.raises(aio.AioRpcError) as two_images:
            await stub.ModelInfer(two, timeout=5)
        floats = messages.build_request("chain", {"raw": np.ones(1, np.float32)})
        with pytest.raises(aio.AioRpcError) as not_bytes:
            await stub.ModelInfer(floats, timeout=5)
    assert bad_step.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "step 'a'" in bad_step.value.details()
    assert "x must be positive" in bad_step.value.details()
    # One gRPC code may stand for several REST statuses (RESOURCE_EXHAUSTED: 413 or 429):
    # the door says which, as a unary call's trailer and a stream answer's parameter.
    assert dict(bad_step.value.trailing_metadata())["http-status"] == "400"
    assert "x must be positive" in streamed.error_message
    about = _parameters(streamed.infer_response)
    assert about["http_status"] == 400
    assert about["status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert "chain" in unknown.value.details()
    assert two_images.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected shape [1], got [2]" in two_images.value.details()
    assert not_bytes.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_service_down_is_unavailable(door, tmp_path) -> None:
    async with door(PIPES, chain_models()) as stub:
        pass  # the services of this door are stopped with it; a new door points nowhere
    path = tmp_path / "down.yaml"
    path.write_text(yaml.safe_dump({"pipelines": PIPES}))
    env = {"PARSE_URL": "127.0.0.1:1", "MODELS_URL": "127.0.0.1:1"}
    state = ProxyState.build(ProxySettings(pipelines=path), env)
    server = grpc_door(state, 0)
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(aio.AioRpcError) as down:
                await stub.ModelInfer(image(body(1)), timeout=5)
    finally:
        await server.stop(0)
        await state.channels.close()
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "step 'parse'" in down.value.details()


@pytest.mark.parametrize("how", ["grpc deadline", "triton timeout"])
async def test_the_callers_deadline_is_the_pipelines(door, how: str) -> None:
    """A step slower than the caller's deadline: DEADLINE_EXCEEDED at the deadline, and the
    step's call is cancelled (the proxy's budget would have allowed it: 3 s)."""
    models = chain_models(delay_s=1.0)
    async with door(PIPES, models) as stub:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(aio.AioRpcError) as late:
            if how == "grpc deadline":
                await stub.ModelInfer(image(body(1)), timeout=0.3)
            else:
                await stub.ModelInfer(image(body(1), timeout=300_000), timeout=5)
        took = loop.time() - started
        await asyncio.sleep(0.1)
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert took < 0.9  # not the step's full second
    assert models[0].cancelled == 1 and models[1].calls == 0


async def test_a_caller_that_leaves_cancels_the_pipeline(door) -> None:
    arrived = asyncio.Event()

    async def slow(inputs, deadline):
        arrived.set()
        await asyncio.sleep(2)
        return {"y": inputs["x"]}

    models = [ScriptedModel("plus1", slow), affine("double", 2, 0)]
    async with door(PIPES, models) as stub:
        call = stub.ModelInfer(image(body(1)), timeout=10)
        await asyncio.wait_for(arrived.wait(), 5)
        call.cancel()
        for _ in range(500):
            if models[0].cancelled:
                break
            await asyncio.sleep(0.01)
    assert models[0].cancelled == 1 and models[1].calls == 0


async def test_the_api_key_guards_the_door_too(door) -> None:
    async with door(PIPES, chain_models(), api_key="s3cret") as stub:
        with pytest.raises(aio.AioRpcError) as refused:
            await stub.ModelInfer(image(body(1)), timeout=5)
        with pytest.raises(aio.AioRpcError) as wrong:
            await stub.ModelMetadata(
                pb.ModelMetadataRequest(name="chain"), metadata=(("x-api-key", "nope"),)
            )
        with_key = await stub.ModelInfer(
            image(body(1)), timeout=5, metadata=(("authorization", "Bearer s3cret"),)
        )
        live = await stub.ServerLive(pb.ServerLiveRequest(), timeout=5)
    assert refused.value.code() == wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert messages.response_outputs(with_key)["y"].tolist() == [[4.0]]
    assert live.live


@pytest.mark.parametrize(
    ("outputs", "complaint"),
    [
        ({"y": {"tensor": "later.y", "datatype": "FP32", "shape": [-1]}}, "names no earlier step"),
        ({"y": {"tensor": "request.raw", "datatype": "BYTES", "shape": [1]}}, "not the request"),
        ({"y": {"tensor": "a.y", "datatype": "FLOAT", "shape": [1]}}, "datatype"),
    ],
)
def test_outputs_are_checked_at_start_up(tmp_path: Path, outputs: dict, complaint: str) -> None:
    path = tmp_path / "p.yaml"
    pipes = {"p": pipeline([call("a", "plus1", "parse")], {"y": "a.y"}, outputs=outputs)}
    path.write_text(yaml.safe_dump({"pipelines": pipes}))
    env = {"PARSE_URL": "127.0.0.1:1", "MODELS_URL": "127.0.0.1:1"}
    with pytest.raises(DefinitionError, match=complaint):
        ProxyState.build(ProxySettings(pipelines=path), env)


async def test_an_output_unlike_its_declaration_is_named(door) -> None:
    pipes = {
        "chain": pipeline(
            [call("a", "plus1", "parse")],
            {"y": "a.y"},
            outputs={"y": {"tensor": "a.y", "datatype": "INT64", "shape": [1, -1]}},
        )
    }
    async with door(pipes, chain_models()) as stub:
        with pytest.raises(aio.AioRpcError) as broken:
            await stub.ModelInfer(image(body(1)), timeout=5)
    assert broken.value.code() == grpc.StatusCode.INTERNAL
    assert "output 'y' came as FP32 [1, 1], declared INT64 [1, -1]" in broken.value.details()


def _parameters(answer: pb.ModelInferResponse) -> dict:
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in answer.parameters.items()}


async def test_answers_say_what_v1_says_beside_the_result(
    door, servers, make_client, tmp_path
) -> None:
    """Every answer carries /v1's `partial` and `steps` as parameters; `result`, asked for by
    name, is /v1's result (a client asking for every output gets the declared ones)."""
    async with door(PIPES, chain_models()) as stub:
        plain = await stub.ModelInfer(image(body(1, 2)), timeout=5)
        request = image(body(1, 2))
        request.outputs.add(name="result")
        asked = await stub.ModelInfer(request, timeout=5)
        meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="chain"), timeout=5)
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(*chain_models())}
    async with make_client(PIPES, env) as client:
        v1 = (await post(client, "chain", body(1, 2))).json()
    assert sorted(messages.response_outputs(plain)) == ["first", "y"]
    assert "result" not in {t.name for t in meta.outputs}
    result = messages.response_outputs(asked)
    assert list(result) == ["result"] and orjson.loads(result["result"][0]) == v1["result"]
    about = _parameters(plain)
    assert about["partial"] is False
    steps = orjson.loads(about["steps"])
    assert (
        [(s["name"], s["status"]) for s in steps]
        == [(s["name"], s["status"]) for s in v1["steps"]]
        == [("parse", "ok"), ("a", "ok"), ("b", "ok")]
    )
    assert all(s["latency_ms"] > 0 for s in steps)


async def test_a_partial_answer_names_the_branch_that_failed(door) -> None:
    async def broken(inputs, deadline):
        raise InvalidInput("x must be positive")

    pipes = {
        "ens": pipeline(
            [partial_fan_out("ens", "plus1", "broken", combine={"op": "mean", "tensor": "y"})],
            {"mean": "ens.y[0]"},
            outputs={"mean": {"tensor": "ens.y", "datatype": "FP32", "shape": [-1, -1]}},
        )
    }
    models = [affine("plus1", 1, 1), ScriptedModel("broken", broken)]
    async with door(pipes, models) as stub:

        async def one():
            yield image(body(4), "ens")

        [streamed] = [r async for r in stub.ModelStreamInfer(one(), timeout=5)]
    assert streamed.error_message == ""
    answer = streamed.infer_response
    assert messages.response_outputs(answer)["mean"].tolist() == [[5.0]]
    about = _parameters(answer)
    assert about["partial"] is True
    steps = {s["name"]: s for s in orjson.loads(about["steps"])}
    assert steps["ens/good"]["status"] == "ok"
    assert steps["ens/bad"]["status"] != "ok"
    assert "x must be positive" in steps["ens/bad"]["error"]


async def test_a_forwarded_model_reloaded_with_other_inputs_is_judged_by_them(door) -> None:
    """The door checks a forwarded call against its model's declared inputs. It once kept
    the first declaration it read until the proxy restarted, and refused the calls a model
    reloaded with other inputs takes. Now it reads it again within PROXY_CACHE_CHECK_MS."""
    plus1 = affine("plus1", 1, 1)
    plus1.inputs = (TensorSpec("x", "FP32", (-1, 2)),)
    three = messages.build_request("plus1", {"x": np.ones((1, 3), np.float32)})
    async with door(PIPES, [plus1, affine("double", 2, 0)], cache_check_ms=100) as stub:
        with pytest.raises(aio.AioRpcError) as refused:
            await stub.ModelInfer(three, timeout=5)
        plus1.inputs = (TensorSpec("x", "FP32", (-1, 3)),)  # reloaded: it takes three now
        await asyncio.sleep(0.3)
        answer = await stub.ModelInfer(three, timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
    assert "[-1, 2]" in (refused.value.details() or ""), refused.value.details()
    assert messages.response_outputs(answer)["y"].tolist() == [[2.0, 2.0, 2.0]]


async def test_loading_a_model_is_the_predictors_not_the_doors(door) -> None:
    """tritonclient's load_model at the door: a clear refusal, not a method unknown."""
    async with door(PIPES, chain_models()) as stub:
        with pytest.raises(aio.AioRpcError) as refused:
            await stub.RepositoryModelLoad(
                pb.RepositoryModelLoadRequest(model_name="plus1"), timeout=5
            )
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "has no model repository" in (refused.value.details() or "")
