from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from protos import codec, messages, pb, wire
from protos.errors import InvalidInput


def inputs_of(request: pb.ModelInferRequest, **kwargs) -> dict[str, np.ndarray]:
    """What a server decodes from `request`, received as bytes."""
    return messages.request_inputs(wire.parse_infer_request(request.SerializeToString()), **kwargs)


def to_raw(array: np.ndarray) -> tuple[str, bytes]:
    datatype, view = codec.to_raw_view(array)
    return datatype, bytes(view)


def built_response(model: str, version: str, outputs: dict) -> pb.ModelInferResponse:
    return pb.ModelInferResponse.FromString(messages.build_response_bytes(model, version, outputs))


NUMERIC = [k for k in codec.DATATYPE_TO_DTYPE if k != "BYTES"]


@pytest.mark.parametrize("datatype", NUMERIC)
@given(data=st.data())
def test_numeric_round_trip(datatype: str, data: st.DataObject) -> None:
    dtype = codec.DATATYPE_TO_DTYPE[datatype]
    arr = data.draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=4, max_side=5)))
    name, raw = to_raw(arr)
    assert name == datatype
    back = codec.from_raw(raw, datatype, arr.shape)
    np.testing.assert_array_equal(back, arr)
    assert back.dtype == dtype


def test_raw_is_little_endian_whatever_the_input_order() -> None:
    big = np.array([1, 256], dtype=">u2")
    _, raw = to_raw(big)
    assert raw == b"\x01\x00\x00\x01"


@given(st.lists(st.binary(max_size=40), max_size=12))
def test_bytes_round_trip(items: list[bytes]) -> None:
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    name, raw = to_raw(arr)
    assert name == "BYTES"
    assert raw == b"".join(len(i).to_bytes(4, "little") + i for i in items)
    back = codec.from_raw(raw, "BYTES", [len(items)])
    assert list(back) == items


def test_str_elements_encode_as_utf8() -> None:
    _, raw = to_raw(np.array(["é"], dtype=object))
    assert raw == b"\x02\x00\x00\x00\xc3\xa9"


@pytest.mark.parametrize(
    ("raw", "shape", "message"),
    [
        (b"\x05\x00\x00\x00ab", [1], "declares 5 bytes"),
        (b"\x01\x00\x00\x00a\x00", [1], "left over"),
        (b"\x00\x00\x00\x00", [2], "cannot hold"),
    ],
)
def test_malformed_bytes_are_rejected(raw: bytes, shape: list[int], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        codec.from_raw(raw, "BYTES", shape, "t")


def test_wrong_raw_length_names_tensor_and_sizes() -> None:
    with pytest.raises(InvalidInput, match=r"input 'img': raw contents are 7 bytes.*needs 8"):
        codec.from_raw(b"\x00" * 7, "FP32", [2], "img")


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([-1, 3], "negative"),
        ([1 << 20, 1 << 20], "more than the limit"),
        ([1] * 9, "rank 9"),
        # No elements, but dimensions numpy cannot hold (found by the hypothesis suite).
        ([0, 22285, 10171138, 10172965], "without its zero dimensions"),
    ],
)
def test_hostile_shapes_fail_before_allocating(shape: list[int], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        codec.from_raw(b"", "FP32", shape, "x")
    with pytest.raises(InvalidInput, match=message):
        codec.from_raw(b"", "BYTES", shape, "x")


def test_unknown_datatype() -> None:
    with pytest.raises(InvalidInput, match="unknown datatype 'FP8'"):
        codec.from_raw(b"", "FP8", [0], "x")


def test_request_round_trip_and_typed_contents() -> None:
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    req = messages.build_request("m", {"x": x, "s": np.array([b"a"], dtype=object)}, request_id="7")
    got = inputs_of(req)
    np.testing.assert_array_equal(got["x"], x)
    assert req.id == "7" and list(got["s"]) == [b"a"]

    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="x", datatype="INT32", shape=[2, 3]).contents.int_contents.extend(
        range(6)
    )
    np.testing.assert_array_equal(inputs_of(typed)["x"], x)


def test_request_consistency_errors() -> None:
    req = messages.build_request("m", {"a": np.zeros(1, np.float32), "b": np.zeros(1, np.float32)})
    del req.raw_input_contents[1]
    with pytest.raises(
        InvalidInput, match="2 inputs outside shared memory but 1 raw_input_contents"
    ):
        inputs_of(req)

    dup = messages.build_request("m", {"a": np.zeros(1, np.float32)})
    dup.inputs.add(name="a", datatype="FP32", shape=[1])
    dup.raw_input_contents.append(b"\x00" * 4)
    with pytest.raises(InvalidInput, match="appears twice"):
        inputs_of(dup)

    many = pb.ModelInferRequest(model_name="m")
    for i in range(codec.DEFAULT_LIMITS.max_inputs + 1):
        many.inputs.add(name=f"i{i}", datatype="FP32", shape=[0])
    with pytest.raises(InvalidInput, match="more than 64"):
        inputs_of(many)


def test_typed_contents_count_and_range_checked() -> None:
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[3]).contents.fp32_contents.extend([1.0])
    with pytest.raises(InvalidInput, match="holds 1 values, but shape \\[3\\] needs 3"):
        inputs_of(req)
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="UINT8", shape=[1]).contents.uint_contents.extend([300])
    with pytest.raises(InvalidInput, match="does not fit UINT8"):
        inputs_of(req)


def test_response_outputs_reads_raw() -> None:
    probs = np.array([[0.25, 0.75]], dtype=np.float32)
    resp = built_response("m", "1", {"p": probs})
    assert resp.raw_output_contents and not resp.outputs[0].HasField("contents")
    np.testing.assert_array_equal(messages.response_outputs(resp)["p"], probs)


@pytest.mark.parametrize("shape", [(0,), (0, 4, 2), (3, 0), ()])
def test_empty_and_scalar_tensors_round_trip(shape: tuple[int, ...]) -> None:
    arr = np.zeros(shape, dtype=np.float32)
    data = messages.build_response_bytes("m", "1", {"t": arr})
    back = messages.response_outputs(pb.ModelInferResponse.FromString(data))["t"]
    assert back.shape == shape
