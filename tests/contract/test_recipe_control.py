"""Model control on the preprocess service: its recipe file is its repository
(preprocess/repository.py). A real service in poll mode, its file edited while four clients
call without a pause: no request fails, every answer is its recipe's, and a broken edit leaves
the recipes serving and raises the failing gauge until the file is mended. In process, with
every edge: tests/preprocess/test_recipe_repository.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import httpx
import pytest

from compose.processes import start_service
from protos import messages, pb, pb_grpc
from tests.contract.calling import calling, proxy_over, until
from tests.preprocess.test_recipe_repository import GRAY, image


def replace(path: Path, text: str) -> None:
    """The file replaced in one step (written aside, renamed), as a ConfigMap's update is."""
    aside = path.with_suffix(".new")
    aside.write_text(text)
    aside.rename(path)


def recipes(scale: float) -> str:
    return "recipes:" + GRAY.format(name="gray", scale=scale)


def out(stub: pb_grpc.GRPCInferenceServiceStub, name: str = "gray") -> float:
    reply = stub.ModelInfer(messages.build_request(name, {"image": image()}), timeout=10)
    return float(messages.response_outputs(reply)["out"][0, 0])


def failing(metrics_port: int | None) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    line = next(x for x in text.splitlines() if x.startswith('v2_model_load_failing{model="gray"}'))
    return float(line.split()[-1])


def test_an_edited_recipe_file_is_followed_under_load(tmp_path: Path) -> None:
    path = tmp_path / "recipes.yaml"
    path.write_text(recipes(1.0))
    args = ["--config", str(path), "--model-control-mode", "poll", "--repository-poll-secs", "0.2"]
    service = start_service("preprocess", args, tmp_path)
    channel = grpc.insecure_channel(service.address)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    with calling(lambda: out(stub)) as calls:
        time.sleep(0.5)
        replace(path, recipes(2.0))
        until(lambda: bool(calls.answers) and calls.answers[-1] == 200.0)
        replace(path, "recipes:\n  gray: {steps: [")  # a broken edit
        until(lambda: failing(service.metrics_port) == 1)
        time.sleep(0.5)
        assert calls.answers[-1] == 200.0, "still served as it was"
        replace(path, recipes(3.0))
        until(lambda: bool(calls.answers) and calls.answers[-1] == 300.0)
        time.sleep(1.2)  # the replaced recipes retired meanwhile (linger 1 s, drain, stop)
    answers = calls.answers
    assert calls.errors == [], calls.errors[:3]
    assert answers[0] == 100.0 and set(answers) == {100.0, 200.0, 300.0}, set(answers)
    assert failing(service.metrics_port) == 0
    channel.close()
    assert service.stop() == 0


def test_explicit_mode_loads_and_unloads_recipes(tmp_path: Path) -> None:
    path = tmp_path / "recipes.yaml"
    path.write_text(recipes(1.0) + GRAY.format(name="other", scale=0.5))
    args = ["--config", str(path), "--model-control-mode", "explicit", "--load-model", "gray"]
    service = start_service("preprocess", args, tmp_path)
    with grpc.insecure_channel(service.address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=5)
        assert {m.name: m.reason for m in index.models} == {"gray": "", "other": "not loaded"}
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="other"), timeout=10)
        assert out(stub, "other") == 50.0
        replace(path, recipes(4.0) + GRAY.format(name="other", scale=0.5))
        assert out(stub) == 100.0, "explicit mode reloads when asked, not before"
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="gray"), timeout=10)
        assert out(stub) == 400.0
        stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="other"), timeout=10)
        with pytest.raises(grpc.RpcError) as gone:
            out(stub, "other")
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    assert service.stop() == 0


GRAY_PIPELINE = {
    "input": "image",
    "accept": ["png"],
    "cache": {"ttl_s": 300},
    "steps": [
        {
            "call": {
                "name": "gray",
                "endpoint": "PREPROCESS_URL",
                "model": "gray",
                "inputs": {"image": "request.image"},
            }
        }
    ],
    "result": {"out": "gray.out[0]"},
}


async def test_the_proxy_follows_an_edited_recipe(tmp_path: Path) -> None:
    """A cached pipeline over a recipe edited in place: the recipe keeps its version and its
    tensors, and only its digest (the configuration's `mesh.sha256`) tells the proxy it
    changed. Within PROXY_CACHE_CHECK_MS of the new recipe serving, the proxy answers from
    it, never from the old recipe's cached answer."""
    path = tmp_path / "recipes.yaml"
    path.write_text(recipes(1.0))
    args = ["--config", str(path), "--model-control-mode", "poll", "--repository-poll-secs", "0.2"]
    service = start_service("preprocess", args, tmp_path)
    png = image()[0]
    headers = {"Content-Type": "image/png"}
    with grpc.insecure_channel(service.address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        env = {"PREPROCESS_URL": service.address}
        async with proxy_over(tmp_path, "gray", GRAY_PIPELINE, env) as client:
            url = "/v1/pipelines/gray/infer"
            first = await client.post(url, content=png, headers=headers)
            again = await client.post(url, content=png, headers=headers)
            await asyncio.to_thread(replace, path, recipes(2.0))
            await asyncio.to_thread(until, lambda: out(stub) == 200.0)
            await asyncio.sleep(0.3)  # past PROXY_CACHE_CHECK_MS
            after = await client.post(url, content=png, headers=headers)
    assert first.status_code == 200, first.text
    assert first.headers["x-cache"] == "miss" and again.headers["x-cache"] == "hit"
    assert again.json()["result"]["out"][0] == 100.0
    assert after.status_code == 200, after.text
    assert after.headers["x-cache"] == "miss" and after.json()["result"]["out"][0] == 200.0
    assert service.stop() == 0
