"""Malformed and hostile v2 requests straight to our gRPC services: a clean status, never a
crash, and no allocation the request did not pay for."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos import pb
from tests.contract.conftest import Target

OK_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}


def status_of(stub, request: pb.ModelInferRequest) -> grpc.StatusCode:
    try:
        stub.ModelInfer(request, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def hostile(target: Target) -> list[tuple[str, pb.ModelInferRequest]]:
    name = target.model
    cases = []
    r = pb.ModelInferRequest(model_name=name)
    r.inputs.add(name="x", datatype="FP32", shape=[1 << 40, 1 << 40])
    r.raw_input_contents.append(b"\x00" * 16)
    cases.append(("enormous dims", r))
    r = pb.ModelInferRequest(model_name=name)
    r.inputs.add(name="x", datatype="FP32", shape=[-5, 4])
    r.raw_input_contents.append(b"")
    cases.append(("negative dim", r))
    r = pb.ModelInferRequest(model_name=name)
    r.inputs.add(name="image", datatype="BYTES", shape=[1 << 30])
    r.raw_input_contents.append(b"\x01\x00\x00\x00a")
    cases.append(("BYTES count larger than payload", r))
    r = pb.ModelInferRequest(model_name=name)
    for i in range(5000):
        r.inputs.add(name=f"i{i}", datatype="FP32", shape=[1])
        r.raw_input_contents.append(b"\x00" * 4)
    cases.append(("thousands of inputs", r))
    r = pb.ModelInferRequest(model_name=name)
    r.inputs.add(name="x", datatype="COMPLEX64", shape=[1])
    r.raw_input_contents.append(b"\x00" * 8)
    cases.append(("unknown datatype", r))
    r = pb.ModelInferRequest(model_name=name, model_version="-1")
    cases.append(("negative version", r))
    r = pb.ModelInferRequest(model_name="x" * 10_000)
    cases.append(("huge model name", r))
    return cases


def test_hostile_requests_get_clean_errors(stub, target: Target) -> None:
    for label, request in hostile(target):
        code = status_of(stub, request)
        assert code in OK_CODES, f"{label}: {code}"
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    datatype=st.sampled_from(["FP32", "INT64", "BYTES", "UINT8", "BOOL", "FP16", "??"]),
    shape=st.lists(st.integers(-3, 1 << 33), max_size=5),
    raw=st.binary(max_size=64),
    name=st.sampled_from(["x", "image", "input", ""]),
)
def test_random_tensors_never_crash(stub, target: Target, datatype, shape, raw, name) -> None:
    request = pb.ModelInferRequest(model_name=target.model)
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    assert status_of(stub, request) in OK_CODES | {grpc.StatusCode.OK}


@pytest.mark.parametrize("garbage", [b"\xff" * 10, b"\x0a\xff\xff\xff\xff\x0f", b"\x3a"])
def test_undecodable_messages_are_invalid(target: Target, garbage: bytes) -> None:
    with grpc.insecure_channel(target.address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as info:
            call(garbage, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
