"""Triton's model control on the predictor service (v2server/control.py): real processes on a
repository on disk, tritonclient's load_model / unload_model in explicit mode, and a
repository changed under a running service in poll mode, with requests in flight all along.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from compose.processes import Service, start_service
from protos import messages, pb, pb_grpc
from tests.contract.calling import calling, proxy_over, until
from tests.modelgen import _write, linear_model, linear_weights

PROBE = Path(__file__).with_name("model_control_probe.py")
X = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
CONFIG = {"max_batch_size": 16, "onnxruntime": {"intra_op_threads": 1}}


def _add_version(root: Path, name: str, version: int) -> None:
    """A version folder put in place at once, as a deployment would (written aside, renamed):
    a poll never sees half a model."""
    _write(root / ".staging", name, version, linear_model(version), CONFIG)
    (root / name).mkdir(exist_ok=True)
    (root / ".staging" / name / str(version)).rename(root / name / str(version))
    shutil.copy(root / ".staging" / name / "config.yaml", root / name / "config.yaml")


def expected(version: str) -> np.ndarray:
    w, b = linear_weights(int(version))
    return X @ w + b


def answer(stub: pb_grpc.GRPCInferenceServiceStub, name: str = "linear") -> tuple[str, np.ndarray]:
    reply = stub.ModelInfer(messages.build_request(name, {"x": X}), timeout=10)
    return reply.model_version, messages.response_outputs(reply)["y"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "repository").mkdir()
    return tmp_path / "repository"


@pytest.fixture
def started(tmp_path: Path, repo: Path) -> Iterator:
    services: list[Service] = []

    def start(*args: str) -> tuple[Service, pb_grpc.GRPCInferenceServiceStub]:
        service = start_service("predictors", ["--repository", str(repo), *args], tmp_path)
        services.append(service)
        channel = grpc.insecure_channel(service.address)
        channels.append(channel)
        return service, pb_grpc.GRPCInferenceServiceStub(channel)

    channels: list[grpc.Channel] = []
    yield start
    for channel in channels:
        channel.close()
    for service in services:
        service.stop()


def _index(stub: pb_grpc.GRPCInferenceServiceStub) -> dict[str, tuple[str, str]]:
    index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=5)
    return {m.name: (m.state, m.reason) for m in index.models}


def tritonclient(address: str, action: str, model: str, *config: str) -> dict:
    """tritonclient's load_model / unload_model, in a process of its own (PROBE)."""
    done = subprocess.run(
        [sys.executable, str(PROBE), address, action, model, *config],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_explicit_mode_loads_and_unloads_with_tritonclient(started, repo: Path) -> None:
    _add_version(repo, "linear", 1)
    _add_version(repo, "other", 1)
    service, stub = started("--model-control-mode", "explicit", "--load-model", "linear")
    assert _index(stub) == {"linear": ("READY", ""), "other": ("UNAVAILABLE", "not loaded")}

    loaded = tritonclient(service.address, "load", "other")
    assert loaded["error"] is None and loaded["ready"], loaded
    assert "model_repository" in loaded["extensions"]
    version, y = answer(stub, "other")
    np.testing.assert_allclose(y, expected(version), rtol=1e-5)

    unloaded = tritonclient(service.address, "unload", "linear")
    assert unloaded["error"] is None and not unloaded["ready"], unloaded
    with pytest.raises(grpc.RpcError) as gone:
        answer(stub)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    assert _index(stub)["linear"] == ("UNAVAILABLE", "unloaded")
    assert tritonclient(service.address, "load", "linear")["ready"]  # and back
    assert answer(stub)[0] == "1"

    unknown = tritonclient(service.address, "load", "nope")
    assert "has no model 'nope'" in unknown["error"]["message"], unknown
    overridden = tritonclient(service.address, "load", "linear", '{"max_batch_size": 4}')
    assert "loads from its repository only" in overridden["error"]["message"], overridden
    assert overridden["ready"]  # refused, and the model serving as it was


def test_a_reload_that_fails_leaves_the_model_serving(started, repo: Path) -> None:
    _add_version(repo, "linear", 1)
    _, stub = started("--model-control-mode", "explicit", "--load-model", "*")
    (repo / "linear" / "2").mkdir()
    (repo / "linear" / "2" / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(grpc.RpcError) as failed:
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="linear"), timeout=30)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = failed.value.details() or ""
    assert "linear/2/model.onnx" in details and "still serving version(s) 1" in details
    version, y = answer(stub)
    assert version == "1"
    np.testing.assert_allclose(y, expected("1"), rtol=1e-5)


def test_without_model_control_loading_is_refused(predictor_stub) -> None:
    """The suite's predictor runs in the default mode (none)."""
    with pytest.raises(grpc.RpcError) as refused:
        predictor_stub.RepositoryModelLoad(
            pb.RepositoryModelLoadRequest(model_name="linear"), timeout=5
        )
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "--model-control-mode explicit" in (refused.value.details() or "")


def test_poll_mode_follows_the_repository_under_load(started, repo: Path) -> None:
    """A new version is served within a poll, and a removed model unloaded, while four
    clients call without a pause: no request fails, and every answer is its version's."""
    _add_version(repo, "linear", 1)
    _, stub = started("--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    with calling(lambda: answer(stub)) as calls:
        time.sleep(0.5)
        _add_version(repo, "linear", 2)  # the default policy serves the latest alone
        until(lambda: bool(calls.answers) and calls.answers[-1][0] == "2")
        time.sleep(1.5)  # version 1 retired meanwhile (lingers 1 s, drains, stops)
    answers = calls.answers
    assert calls.errors == [], calls.errors[:3]
    versions = [v for v, _ in answers]
    assert versions[0] == "1" and versions[-1] == "2", sorted(set(versions))
    for version, y in answers:
        np.testing.assert_allclose(y, expected(version), rtol=1e-5)
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="linear"), timeout=5)
    assert list(meta.versions) == ["2"]

    shutil.rmtree(repo / "linear")
    until(lambda: "linear" not in _index(stub))
    with pytest.raises(grpc.RpcError) as gone:
        answer(stub)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


LINEAR_PIPELINE = {
    "inputs": {"x": {"datatype": "FP32", "shape": [-1, 4]}},
    "cache": {"ttl_s": 300},
    "steps": [
        {
            "call": {
                "name": "lin",
                "endpoint": "LINEAR_URL",
                "model": "linear",
                "inputs": {"x": "request.x"},
            }
        }
    ],
    "result": {"y": "lin.y"},
}


def _replace_in_place(repo: Path, weights_of: int) -> None:
    """Version 1's model.onnx swapped for other weights, same version number (a retrained
    model copied over the old one), in one rename."""
    _write(repo / ".staging", "linear", 9, linear_model(weights_of), CONFIG)
    (repo / ".staging" / "linear" / "9" / "model.onnx").rename(repo / "linear" / "1" / "model.onnx")


@pytest.mark.parametrize("how", ["new version", "replaced in place"])
async def test_the_proxy_follows_a_reloaded_model(
    started, repo: Path, tmp_path: Path, how: str
) -> None:
    """A cached pipeline on a predictor that reloads its model: once the new model serves,
    the proxy answers from it within PROXY_CACHE_CHECK_MS, never from the old one's cached
    answers. The cache key covers the model's metadata and configuration
    (proxy/transport/catalog.py); a model replaced in place keeps its version and tensors,
    and only the digest of its files in the configuration tells it apart: before that, the
    proxy kept answering the old model's cached answers for their whole TTL."""
    _add_version(repo, "linear", 1)
    service, stub = started("--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    body = {"x": X.tolist()}
    async with proxy_over(
        tmp_path, "lin", LINEAR_PIPELINE, {"LINEAR_URL": service.address}
    ) as client:
        first = await client.post("/v1/pipelines/lin/infer", json=body)
        again = await client.post("/v1/pipelines/lin/infer", json=body)
        if how == "new version":
            _add_version(repo, "linear", 2)
        else:
            _replace_in_place(repo, weights_of=2)
        await asyncio.to_thread(
            until, lambda: np.allclose(answer(stub)[1], expected("2"), rtol=1e-5)
        )
        await asyncio.sleep(0.3)  # past PROXY_CACHE_CHECK_MS
        after = await client.post("/v1/pipelines/lin/infer", json=body)
    assert first.headers["x-cache"] == "miss" and again.headers["x-cache"] == "hit"
    np.testing.assert_allclose(again.json()["result"]["y"], expected("1"), rtol=1e-5)
    assert after.status_code == 200, after.text
    assert after.headers["x-cache"] == "miss"
    np.testing.assert_allclose(after.json()["result"]["y"], expected("2"), rtol=1e-5)
