from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from protos import pb_grpc
from tests.conftest import v2_target


@dataclass(frozen=True)
class Target:
    address: str
    model: str
    ours: bool
    """True when the server is this project's predictor started by the suite."""


@pytest.fixture(scope="module")
def target(request: pytest.FixtureRequest) -> Target:
    address = v2_target()
    if address:
        return Target(address, os.environ.get("V2_MODEL", "linear"), ours=False)
    return Target(request.getfixturevalue("predictor").address, "linear", ours=True)


@pytest.fixture(scope="module")
def stub(target: Target) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(target.address) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        yield pb_grpc.GRPCInferenceServiceStub(channel)
