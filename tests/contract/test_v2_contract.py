"""The Open Inference Protocol v2 contract, runnable against any v2 gRPC server.

By default it starts this project's predictor on a test model; point it
elsewhere with V2_TARGET=host:port (and V2_MODEL=name, a model whose inputs
accept zeros).
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from protos import codec, messages, pb, pb_grpc
from tests.contract.conftest import Target

TIMEOUT = 10.0


def metadata(stub: pb_grpc.GRPCInferenceServiceStub, model: str) -> pb.ModelMetadataResponse:
    return stub.ModelMetadata(pb.ModelMetadataRequest(name=model), timeout=TIMEOUT)


def valid_input(meta: pb.ModelMetadataResponse, target: Target) -> dict[str, np.ndarray]:
    """The target's sample, or zeros for every declared input (dynamic dimensions: 1)."""
    if target.sample is not None:
        return dict(target.sample)
    out = {}
    for t in meta.inputs:
        shape = [1 if d < 0 else d for d in t.shape]
        if t.datatype == "BYTES":
            out[t.name] = np.full(shape, b"", dtype=object)
        else:
            out[t.name] = np.zeros(shape, dtype=codec.dtype_of(t.datatype))
    return out


def expect_error(call, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value.details()
    return info.value.details() or ""


def test_server_live_and_ready(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=TIMEOUT).live is True
    assert stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT).ready is True


def test_model_ready(stub: pb_grpc.GRPCInferenceServiceStub, target: Target) -> None:
    assert stub.ModelReady(pb.ModelReadyRequest(name=target.model), timeout=TIMEOUT).ready


def test_server_metadata(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    meta = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=TIMEOUT)
    assert meta.name and meta.version


def test_model_metadata(stub: pb_grpc.GRPCInferenceServiceStub, target: Target) -> None:
    meta = metadata(stub, target.model)
    assert meta.name == target.model
    assert meta.versions, "a model reports at least one version"
    assert meta.inputs and meta.outputs
    for t in [*meta.inputs, *meta.outputs]:
        assert t.datatype in codec.DATATYPE_TO_DTYPE, t
        assert all(d >= -1 for d in t.shape), t


def test_infer_returns_declared_outputs_as_raw(
    stub: pb_grpc.GRPCInferenceServiceStub, target: Target
) -> None:
    meta = metadata(stub, target.model)
    response = stub.ModelInfer(
        messages.build_request(target.model, valid_input(meta, target), request_id="r-1"),
        timeout=TIMEOUT,
    )
    assert response.model_name == target.model
    assert response.id == "r-1"
    assert len(response.raw_output_contents) == len(response.outputs)
    declared = {t.name: t for t in meta.outputs}
    outputs = messages.response_outputs(response)
    assert set(outputs) == set(declared)
    for name, arr in outputs.items():
        assert codec.datatype_of(arr) == declared[name].datatype


def test_infer_requested_output_only(
    stub: pb_grpc.GRPCInferenceServiceStub, target: Target
) -> None:
    meta = metadata(stub, target.model)
    wanted = meta.outputs[-1].name
    request = messages.build_request(target.model, valid_input(meta, target), outputs=[wanted])
    response = stub.ModelInfer(request, timeout=TIMEOUT)
    assert [o.name for o in response.outputs] == [wanted]


def test_unknown_model_is_not_found(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = messages.build_request("no_such_model", {"x": np.zeros((1, 1), np.float32)})
    expect_error(lambda: stub.ModelInfer(request, timeout=TIMEOUT), grpc.StatusCode.NOT_FOUND)
    expect_error(
        lambda: stub.ModelMetadata(pb.ModelMetadataRequest(name="no_such_model"), timeout=TIMEOUT),
        grpc.StatusCode.NOT_FOUND,
    )


def test_unknown_version_is_not_found(
    stub: pb_grpc.GRPCInferenceServiceStub, target: Target
) -> None:
    meta = metadata(stub, target.model)
    request = messages.build_request(
        target.model, valid_input(meta, target), model_version="987654"
    )
    expect_error(lambda: stub.ModelInfer(request, timeout=TIMEOUT), grpc.StatusCode.NOT_FOUND)


def _first_input(stub: pb_grpc.GRPCInferenceServiceStub, target: Target):
    meta = metadata(stub, target.model)
    inputs = valid_input(meta, target)
    return meta, inputs, meta.inputs[0].name


def test_wrong_input_name_is_invalid(
    stub: pb_grpc.GRPCInferenceServiceStub, target: Target
) -> None:
    _, inputs, name = _first_input(stub, target)
    inputs["__no_such_input__"] = inputs.pop(name)
    request = messages.build_request(target.model, inputs)
    details = expect_error(
        lambda: stub.ModelInfer(request, timeout=TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert "__no_such_input__" in details or name in details


def test_wrong_datatype_is_invalid(stub: pb_grpc.GRPCInferenceServiceStub, target: Target) -> None:
    _, inputs, name = _first_input(stub, target)
    wrong = np.int32 if codec.datatype_of(inputs[name]) != "INT32" else np.float32
    inputs[name] = np.zeros(inputs[name].shape, dtype=wrong)
    request = messages.build_request(target.model, inputs)
    details = expect_error(
        lambda: stub.ModelInfer(request, timeout=TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert name in details


def test_wrong_rank_is_invalid(stub: pb_grpc.GRPCInferenceServiceStub, target: Target) -> None:
    _, inputs, name = _first_input(stub, target)
    inputs[name] = inputs[name][..., np.newaxis]
    request = messages.build_request(target.model, inputs)
    details = expect_error(
        lambda: stub.ModelInfer(request, timeout=TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert name in details


def test_raw_length_mismatch_is_invalid(
    stub: pb_grpc.GRPCInferenceServiceStub, target: Target
) -> None:
    _, inputs, name = _first_input(stub, target)
    request = messages.build_request(target.model, inputs)
    index = [t.name for t in request.inputs].index(name)
    request.raw_input_contents[index] = request.raw_input_contents[index] + b"\x00"
    details = expect_error(
        lambda: stub.ModelInfer(request, timeout=TIMEOUT), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert name in details


def test_server_survives_bad_requests(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=TIMEOUT).live
