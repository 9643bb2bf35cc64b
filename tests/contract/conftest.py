from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from protos import pb, pb_grpc
from protos.ports import free_port
from samples.images import encode, render_digit
from tests.conftest import v2_target
from tests.modelgen import build_triton_repository
from tests.procs import ROOT, Service


@dataclass(frozen=True)
class Target:
    address: str
    model: str
    ours: bool
    """True when the server is one of this project's services started by the suite."""
    sample: dict[str, np.ndarray] | None = None
    """A valid input; None: zeros of the declared shapes."""
    name: str = ""
    """Which server, when it is a foreign one (for NOT_IMPLEMENTED)."""


def _digit_png() -> dict[str, np.ndarray]:
    image = np.empty(1, dtype=object)
    image[0] = encode(render_digit(np.eye(8) * 16))
    return {"image": image}


def _features() -> dict[str, np.ndarray]:
    """A digit's 64 features, as the digits classifiers take them."""
    return {"input": (np.eye(8) * 16).reshape(1, 64).astype(np.float32)}


@pytest.fixture(autouse=True)
def _not_implemented(request: pytest.FixtureRequest) -> None:
    if "target" not in request.fixturenames:
        return
    target = request.getfixturevalue("target")
    why = NOT_IMPLEMENTED.get((target.name, request.node.originalname))
    if why:
        request.node.add_marker(pytest.mark.xfail(reason=why, strict=True))


@pytest.fixture(scope="session")
def triton_predictor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The predictor on a repository written as Triton's documentation shows (config.pbtxt),
    started with Triton's flag names only."""
    root = build_triton_repository(tmp_path_factory.mktemp("triton-repository"))
    port, metrics_port = free_port(), free_port()
    log_path = tmp_path_factory.mktemp("triton-predictor") / "predictor.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "predictors"),
                *("--model-repository", str(root)),
                *("--grpc-port", str(port)),
                *("--metrics-port", str(metrics_port)),
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    service = Service(proc, port, metrics_port, log_path)
    with grpc.insecure_channel(service.address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, service.log()
            assert time.monotonic() < deadline, service.log()
            try:
                if stub.ServerReady(pb.ServerReadyRequest(), timeout=1).ready:
                    break
            except grpc.RpcError:
                time.sleep(0.1)
    yield service
    service.stop()


FOREIGN_FIXTURES = {"mlserver": "mlserver", "kserve": "kserve_server"}
"""Foreign v2 servers (tests/foreign/) serving the digits MLP as `digits`."""

_UNCHECKED_INPUTS = (
    "inputs are not checked against the model's declared metadata: the runtime gets whatever "
    "came, and a mismatch is the runtime's own error (INTERNAL) or none"
)
_HOSTILE = "malformed requests (enormous dims, random tensors) answered INTERNAL, not refused"
_UNDECODABLE = "undecodable messages: gRPC's own UNKNOWN (its deserializer raised)"
NOT_IMPLEMENTED: dict[tuple[str, str], str] = {
    **{
        (server, test): why
        for server in FOREIGN_FIXTURES
        for test, why in (
            ("test_hostile_requests_get_clean_errors", _HOSTILE),
            ("test_random_tensors_never_crash", _HOSTILE),
            ("test_undecodable_messages_are_invalid", _UNDECODABLE),
        )
    },
    ("mlserver", "test_infer_requested_output_only"): "requested outputs (every output comes)",
    ("mlserver", "test_wrong_input_name_is_invalid"): _UNCHECKED_INPUTS,
    ("mlserver", "test_wrong_datatype_is_invalid"): _UNCHECKED_INPUTS,
    ("mlserver", "test_wrong_rank_is_invalid"): _UNCHECKED_INPUTS,
    ("mlserver", "test_raw_length_mismatch_is_invalid"): "a raw length mismatch is INTERNAL",
    ("kserve", "test_model_metadata"): "model versions (metadata lists none)",
    ("kserve", "test_unknown_version_is_not_found"): "model versions (any version is served)",
    ("kserve", "test_infer_returns_declared_outputs_as_raw"): "raw output contents",
    ("kserve", "test_infer_requested_output_only"): "requested outputs (every output comes)",
    ("kserve", "test_wrong_input_name_is_invalid"): _UNCHECKED_INPUTS,
    ("kserve", "test_wrong_datatype_is_invalid"): _UNCHECKED_INPUTS,
    ("kserve", "test_wrong_rank_is_invalid"): _UNCHECKED_INPUTS,
    ("kserve", "test_raw_length_mismatch_is_invalid"): "a raw length mismatch is INTERNAL",
}
"""(server, test) -> what that server does not implement of the protocol, by name: the
test is expected to fail there (strictly: should it pass, the entry must go)."""


@pytest.fixture(
    scope="module", params=["predictor", "preprocess", "proxy", "triton", *FOREIGN_FIXTURES]
)
def target(request: pytest.FixtureRequest) -> Target:
    """Each of our v2 services (the proxy's gRPC door: a pipeline as a model), each foreign
    server the tests start (MLServer, KServe's model server), or the one server V2_TARGET
    names."""
    address = v2_target()
    if address:
        if request.param != "predictor":
            pytest.skip("V2_TARGET given: the suite runs once, against it")
        return Target(address, os.environ.get("V2_MODEL", "linear"), ours=False)
    if request.param == "predictor":
        return Target(request.getfixturevalue("predictor").address, "linear", ours=True)
    if request.param in FOREIGN_FIXTURES:
        server = request.getfixturevalue(FOREIGN_FIXTURES[request.param])
        return Target(server.address, "digits", ours=False, sample=_features(), name=request.param)
    if request.param == "triton":
        return Target(request.getfixturevalue("triton_predictor").address, "linear_triton", True)
    if request.param == "proxy":
        mesh = request.getfixturevalue("mesh")
        return Target(mesh.grpc_address, "digits", ours=True, sample=_digit_png())
    service = request.getfixturevalue("preprocess_service")
    return Target(service.address, "digits_input", ours=True, sample=_digit_png())


@pytest.fixture(scope="module")
def stub(target: Target) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(target.address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        yield pb_grpc.GRPCInferenceServiceStub(channel)
