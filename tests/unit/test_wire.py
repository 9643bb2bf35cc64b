from __future__ import annotations

import grpc
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protos import codec, messages, pb, wire
from protos.channels import STREAM_STATUS_PARAMETER


@pytest.fixture(params=["whole", "split"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a message is read: parsed whole (the small ones) or its tensors split off
    in place (the large ones; forced here by a bound below every size)."""
    if request.param == "split":
        monkeypatch.setattr(wire, "PARSE_WHOLE_UP_TO", -1)
    return request.param


def sample_request() -> pb.ModelInferRequest:
    return messages.build_request(
        "m",
        {"a": np.arange(300, dtype=np.float32), "b": np.array([b"x", b"yz"], dtype=object)},
        model_version="2",
        request_id="r",
        outputs=["o"],
    )


def test_parsed_request_equals_protobuf_parse(path: str) -> None:
    request = sample_request()
    parsed = wire.parse_infer_request(request.SerializeToString())
    assert not parsed.error
    assert [bytes(v) for v in parsed.raw] == list(request.raw_input_contents)
    head = pb.ModelInferRequest()
    head.CopyFrom(request)
    del head.raw_input_contents[:]
    assert parsed.message == head
    a, b = messages.request_inputs(parsed).values()
    np.testing.assert_array_equal(a, np.arange(300, dtype=np.float32))
    assert list(b) == [b"x", b"yz"]


def test_reserialized_request_is_equivalent(path: str) -> None:
    request = sample_request()
    again = wire.serialize_infer_request(wire.parse_infer_request(request.SerializeToString()))
    assert pb.ModelInferRequest.FromString(again) == request


def test_response_bytes_parse_like_protobufs_own_message(path: str) -> None:
    outputs = {
        "p": np.random.default_rng(0).random((2, 5), dtype=np.float32),
        "label": np.array([3, 1], dtype=np.int64),
    }
    data = messages.build_response_bytes("m", "1", outputs, "id-9")
    expected = pb.ModelInferResponse(model_name="m", model_version="1", id="id-9")
    for name, arr in outputs.items():
        expected.outputs.add(name=name, datatype=codec.datatype_of(arr), shape=arr.shape)
        expected.raw_output_contents.append(arr.tobytes())
    assert pb.ModelInferResponse.FromString(data) == expected
    parsed = wire.parse_infer_response(data)
    got = messages.response_outputs(parsed)
    for name, arr in outputs.items():
        np.testing.assert_array_equal(got[name], arr)


@given(st.binary(max_size=200))
def test_garbage_never_raises_from_the_deserializer(data: bytes) -> None:
    whole = wire.PARSE_WHOLE_UP_TO
    for bound in (whole, -1):  # parsed whole, then split
        wire.PARSE_WHOLE_UP_TO = bound
        try:
            parsed = wire.parse_infer_request(data)
        finally:
            wire.PARSE_WHOLE_UP_TO = whole
        if parsed.error:
            assert parsed.raw == []


def test_truncated_request_reports_an_error(path: str) -> None:
    data = sample_request().SerializeToString()
    parsed = wire.parse_infer_request(data[:-7])
    assert parsed.error


def test_typed_contents_stay_serialized_until_the_shape_is_accepted(monkeypatch) -> None:
    """A request's typed contents are split off unparsed (5 M empty BYTES elements cost
    protobuf ~200 MB to parse) and parsed when its inputs are read."""
    from protos import messages
    from protos.errors import InvalidInput

    # Small requests are parsed whole: split this one as a large one would be.
    monkeypatch.setattr(wire, "PARSE_WHOLE_UP_TO", -1)
    monkeypatch.setattr(wire, "SPLIT_CONTENTS_ABOVE", 0)

    request = pb.ModelInferRequest(model_name="m", id="r")
    x = request.inputs.add(name="x", datatype="FP32", shape=[2])
    x.contents.fp32_contents.extend([1.5, 2.5])
    request.inputs.add(name="s", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"hi")
    parsed = wire.parse_infer_request(request.SerializeToString())
    assert not parsed.error and parsed.message.id == "r"
    assert [t.HasField("contents") for t in parsed.message.inputs] == [False, False]
    assert [list(t.shape) for t in parsed.message.inputs] == [[2], [1]]
    assert all(c is not None for c in parsed.contents)
    inputs = messages.request_inputs(parsed)
    assert inputs["x"].tolist() == [1.5, 2.5] and inputs["s"].tolist() == [b"hi"]
    # Contents that do not parse are the caller's error, found when read.
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1])
    inner = tensor.SerializeToString() + bytes([0x2A, 0x03, 0x0D, 0xFF, 0xFF])  # truncated
    data = pb.ModelInferRequest(model_name="m").SerializeToString()
    data += bytes([0x2A, len(inner)]) + inner
    parsed = wire.parse_infer_request(data)
    assert not parsed.error
    with pytest.raises(InvalidInput, match="contents do not parse"):
        messages.request_inputs(parsed)


def test_stream_answers_read_alike_either_way(path: str) -> None:
    """A stream's answer, and a failed one with its status, read the same whichever way."""
    from proxy.transport.stream_answers import parse_stream_response

    label = {"label": np.array([7], dtype=np.int64)}
    data = wire.stream_response(messages.build_response_bytes("m", "1", label, "id-1"))
    answer = parse_stream_response(data)
    assert answer.id == "id-1" and answer.failure is None and answer.response is not None
    assert not answer.response.message.raw_output_contents  # kept apart, as split
    assert messages.response_outputs(answer.response)["label"].tolist() == [7]
    failed = pb.ModelStreamInferResponse(error_message="model 'm' is not ready")
    failed.infer_response.id = "id-2"
    failed.infer_response.parameters[STREAM_STATUS_PARAMETER].int64_param = 14
    answer = parse_stream_response(failed.SerializeToString())
    assert answer.id == "id-2" and answer.response is None and answer.failure is not None
    assert answer.failure.code() == grpc.StatusCode.UNAVAILABLE
    assert "not ready" in str(answer.failure)
    broken = parse_stream_response(data[:-3])
    assert broken.failure is not None and "malformed" in str(broken.failure)
