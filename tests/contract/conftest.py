from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from protos import pb_grpc
from samples.images import encode, render_digit
from tests.conftest import v2_target


@dataclass(frozen=True)
class Target:
    address: str
    model: str
    ours: bool
    """True when the server is one of this project's services started by the suite."""
    sample: dict[str, np.ndarray] | None = None
    """A valid input; None: zeros of the declared shapes."""


def _digit_png() -> dict[str, np.ndarray]:
    image = np.empty(1, dtype=object)
    image[0] = encode(render_digit(np.eye(8) * 16))
    return {"image": image}


@pytest.fixture(scope="module", params=["predictor", "preprocess", "proxy"])
def target(request: pytest.FixtureRequest) -> Target:
    """Each of our v2 services (the proxy's gRPC door: a pipeline as a model), or the one
    server V2_TARGET names."""
    address = v2_target()
    if address:
        if request.param != "predictor":
            pytest.skip("V2_TARGET given: the suite runs once, against it")
        return Target(address, os.environ.get("V2_MODEL", "linear"), ours=False)
    if request.param == "predictor":
        return Target(request.getfixturevalue("predictor").address, "linear", ours=True)
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
