"""Pipelines as v2 models on the proxy's REST door: JSON (base64 BYTES) and Triton's
binary tensor extension, both ways; the rest of the v2 REST surface."""

from __future__ import annotations

import base64
import struct

import numpy as np
import orjson
import pytest

from tests.proxy.test_grpc_door import PIPES, chain_models
from tests.proxy.test_pipelines import body, call, parse_model, pipeline


@pytest.fixture
async def client(servers, make_client):
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(*chain_models())}
    async with make_client(PIPES, env) as c:
        yield c


def base64_request(raw: bytes, **extra) -> dict:
    return {
        "inputs": [
            {
                "name": "raw",
                "datatype": "BYTES",
                "shape": [1],
                "data": [base64.b64encode(raw).decode()],
                "parameters": {"content_type": "base64"},
            }
        ],
        **extra,
    }


def split_binary(answer) -> tuple[dict, bytes]:
    size = int(answer.headers["inference-header-content-length"])
    return orjson.loads(answer.content[:size]), answer.content[size:]


async def test_a_pipeline_answers_v2_json(client) -> None:
    r = await client.post("/v2/models/chain/infer", json=base64_request(body(1, 2), id="mine"))
    assert r.status_code == 200, r.text
    answer = r.json()
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert answer["model_name"] == "chain" and answer["id"] == "mine"
    assert outputs["y"] == {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [4.0, 6.0]}
    assert outputs["first"]["data"] == [2.0, 3.0]
    # What /v1 says beside its result, as on the gRPC door.
    assert answer["parameters"]["partial"] is False
    steps = orjson.loads(answer["parameters"]["steps"])
    assert [(s["name"], s["status"]) for s in steps] == [("parse", "ok"), ("a", "ok"), ("b", "ok")]


async def test_the_binary_tensor_extension_both_ways(client) -> None:
    """What tritonclient's HTTP client sends: a JSON header, then the image's BYTES element
    length-prefixed; asked for binary outputs, the answer is laid out the same way."""
    raw = body(3)
    element = struct.pack("<I", len(raw)) + raw
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "raw",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": len(element)},
                }
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "first"}],
        }
    )
    r = await client.post(
        "/v2/models/chain/infer",
        content=header + element,
        headers={
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        },
    )
    assert r.status_code == 200, r.text
    meta, rest = split_binary(r)
    outputs = {o["name"]: o for o in meta["outputs"]}
    assert outputs["y"]["parameters"] == {"binary_data_size": 4} and "data" not in outputs["y"]
    assert np.frombuffer(rest, np.float32).tolist() == [8.0]
    assert outputs["first"]["data"] == [4.0]


async def test_binary_data_output_makes_every_output_binary(client) -> None:
    r = await client.post(
        "/v2/models/chain/infer",
        json=base64_request(body(1), parameters={"binary_data_output": True}),
    )
    meta, rest = split_binary(r)
    assert [o["parameters"]["binary_data_size"] for o in meta["outputs"]] == [4, 4]
    assert len(rest) == 8


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"data": ["not base64!"]}, "not base64"),
        ({"shape": [2], "data": ["AA==", "AA=="]}, "expected shape [1], got [2]"),
        ({"parameters": {"binary_data_size": 10}}, "runs past the end of the body"),
        ({"name": "image"}, "has no input 'image'"),
    ],
)
async def test_bad_v2_requests_name_the_problem(client, change: dict, complaint: str) -> None:
    request = base64_request(body(1))
    request["inputs"][0].update(change)
    r = await client.post("/v2/models/chain/infer", json=request)
    assert r.status_code == 400 and complaint in r.json()["error"], r.text


async def test_unknown_outputs_and_versions(client) -> None:
    unknown = await client.post(
        "/v2/models/chain/infer", json=base64_request(body(1), outputs=[{"name": "z"}])
    )
    version = await client.post("/v2/models/chain/versions/7/infer", json=base64_request(body(1)))
    assert unknown.status_code == 400 and "has no output 'z'" in unknown.json()["error"]
    assert version.status_code == 404 and "no version '7'" in version.json()["error"]


async def test_paths_near_the_v2_infer_route(client) -> None:
    """v2 infer is answered ahead of FastAPI's router (routes.InferenceRoutes), its one or
    four segments read as the router reads them; every other path and method still goes
    through the router, in the same error shape."""
    request = base64_request(body(1))
    newest = await client.post("/v2/models/chain/infer", json=request)
    versioned = await client.post("/v2/models/chain/versions/1/infer", json=request)
    get = await client.get("/v2/models/chain/infer")
    nested = await client.post("/v2/models/chain/x/infer", json=request)
    empty = await client.post("/v2/models//infer", json=request)
    no_version = await client.post("/v2/models/chain/versions//infer", json=request)
    unknown = await client.post("/v2/models/nope/infer", json=request)
    stats = await client.post("/v2/models/stats", json=request)
    assert newest.status_code == versioned.status_code == 200
    assert newest.json()["outputs"] == versioned.json()["outputs"]
    assert versioned.json()["model_version"] == "1"
    assert get.status_code == 405 and get.json()["id"] and "POST" in get.headers["allow"]
    assert nested.status_code == empty.status_code == no_version.status_code == 404
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]
    assert stats.status_code == 405 and stats.json()["id"]


async def test_a_failed_step_is_the_same_answer_as_on_v1(servers, make_client) -> None:
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": "127.0.0.1:1"}
    async with make_client(PIPES, env) as client:
        r = await client.post("/v2/models/chain/infer", json=base64_request(body(1)))
    assert r.status_code == 503 and r.json()["step"] == "a" and r.headers["retry-after"] == "1"


async def test_the_rest_of_the_v2_surface(client) -> None:
    server = (await client.get("/v2")).json()
    meta = (await client.get("/v2/models/chain")).json()
    versioned = (await client.get("/v2/models/chain/versions/1")).json()
    ready = await client.get("/v2/models/chain/versions/1/ready")
    model_meta = await client.get("/v2/models/plus1/versions/1")
    assert server["name"] == "inference-mesh-proxy" and "binary_tensor_data" in server["extensions"]
    assert meta == versioned
    assert meta["inputs"] == [{"name": "raw", "datatype": "BYTES", "shape": [1]}]
    assert ready.status_code == 200 and ready.json()["ready"]
    assert model_meta.status_code == 200 and model_meta.json()["name"] == "plus1"


async def test_a_pipeline_may_bear_the_name_of_a_model_it_calls(servers, make_client) -> None:
    """Someone else's server names its model like a pipeline (MLServer's `digits`): the proxy
    starts, the pipeline calls that model, and on /v2 the name means the pipeline."""
    from tests.proxy.scripted import affine

    pipes = {"plus1": pipeline([call("a", "plus1", "parse")], {"y": "a.y"})}
    env = {
        "PARSE_URL": await servers(parse_model()),
        "MODELS_URL": await servers(affine("plus1", 1, 1)),
    }
    async with make_client(pipes, env) as client:
        v1 = await client.post("/v1/pipelines/plus1/infer", content=body(2))
        meta = (await client.get("/v2/models/plus1")).json()
        v2 = await client.post("/v2/models/plus1/infer", json=base64_request(body(2)))
        ready = await client.get("/v2/health/ready")
    assert v1.status_code == 200 and v1.json()["result"] == {"y": [[3.0]]}, v1.text
    assert meta["platform"] == "pipeline" and meta["inputs"][0]["datatype"] == "BYTES"
    assert v2.status_code == 200, v2.text
    assert ready.status_code == 200


async def test_triton_extensions_on_the_rest_door(client) -> None:
    """Configuration, statistics, the repository index and classification over REST, for a
    pipeline and for a model it calls (forwarded), as tritonclient.http reads them."""
    x = {"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1.0, 5.0, 3.0]}
    classified = await client.post(
        "/v2/models/plus1/infer",
        json={"inputs": [x], "outputs": [{"name": "y", "parameters": {"classification": 2}}]},
    )
    await client.post("/v2/models/chain/infer", json=base64_request(body(1)))
    pipeline_config = (await client.get("/v2/models/chain/config")).json()
    model_config = (await client.get("/v2/models/plus1/versions/1/config")).json()
    stats = (await client.get("/v2/models/chain/stats")).json()["model_stats"]
    every = (await client.get("/v2/models/stats")).json()["model_stats"]
    index = (await client.post("/v2/repository/index", json={"ready": True})).json()
    server = (await client.get("/v2")).json()
    assert classified.status_code == 200, classified.text
    answer = classified.json()
    assert answer["model_version"] == "1"  # a forwarded answer names its version
    assert answer["outputs"][0]["data"] == ["6.000000:1", "4.000000:2"]  # top 2 of x + 1
    assert pipeline_config["name"] == "chain" and pipeline_config["max_batch_size"] == 0
    assert pipeline_config["input"][0]["name"] == "raw"
    assert model_config["name"] == "plus1" and model_config["platform"] == "scripted"
    (chain,) = stats
    assert chain["inference_stats"]["success"]["count"] == 1  # a number, as Triton writes it
    assert {s["name"] for s in every} >= {"chain", "plain", "plus1", "double", "parse"}
    assert {(m["name"], m["state"]) for m in index} == {
        (n, "READY") for n in ("chain", "plain", "plus1", "double", "parse")
    }
    assert set(server["extensions"]) == {
        "binary_tensor_data",
        "classification",
        "model_configuration",
        "statistics",
    }


async def test_forwarded_errors_and_unknown_names_read_as_on_the_grpc_door(client) -> None:
    bad = await client.post(
        "/v2/models/plus1/infer",
        json={"inputs": [{"name": "z", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]},
    )
    unknown = await client.get("/v2/models/nope/config")
    assert bad.status_code == 400 and bad.json()["code"] == "INVALID_ARGUMENT"
    assert bad.json()["error"].count("model 'plus1'") == 1, bad.text  # said once
    assert unknown.status_code == 404
    assert "served: chain, double, parse, plain, plus1" in unknown.json()["error"]


async def test_loading_a_model_is_refused_as_on_the_grpc_door(client) -> None:
    """tritonclient.http's load_model and unload_model: 501 naming why, not 404."""
    for action in ("load", "unload"):
        r = await client.post(f"/v2/repository/models/plus1/{action}", json={})
        assert r.status_code == 501, r.text
        assert r.json()["code"] == "UNIMPLEMENTED"
        assert f"has no model repository to {action} models from" in r.json()["error"]


async def test_the_rest_door_may_serve_the_pipelines_only(servers, make_client) -> None:
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(*chain_models())}
    async with make_client(PIPES, env, v2_models="pipelines") as c:
        hidden = await c.get("/v2/models/plus1")
        index = (await c.post("/v2/repository/index")).json()
    assert hidden.status_code == 404 and "served: chain, plain" in hidden.json()["error"]
    assert sorted(m["name"] for m in index) == ["chain", "plain"]


async def test_a_v2_body_counts_in_the_bytes_in_flight(servers, make_client) -> None:
    """A v2 body is on the proxy's bytes in flight as it arrives (uncounted, 64 bodies of
    17.7 MiB at once took the proxy to 2 GiB): past the bound it is refused 503, within it
    answered, and its bytes are let go with its answer."""
    env = {"PARSE_URL": await servers(parse_model()), "MODELS_URL": await servers(*chain_models())}
    sent = orjson.dumps(base64_request(body(1, 2)))
    headers = {"Content-Type": "application/json"}
    async with make_client(PIPES, env, max_inflight_mb=(len(sent) - 1) / 2**20) as c:
        r = await c.post("/v2/models/chain/infer", content=sent, headers=headers)
        assert r.status_code == 503, r.text
        assert "requests in flight" in r.json()["error"] and r.headers["Retry-After"]
    async with make_client(PIPES, env, max_inflight_mb=(len(sent) + 16) / 2**20) as c:
        for _ in range(2):  # the first one's bytes were let go: room for the second
            r = await c.post("/v2/models/chain/infer", content=sent, headers=headers)
            assert r.status_code == 200, r.text
