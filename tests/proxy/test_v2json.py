"""v2 REST JSON requests: every malformed or hostile one is a 400 naming the field, before
anything large is allocated."""

from __future__ import annotations

import contextlib
import tracemalloc

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protos.errors import InvalidInput
from proxy.doors import v2json

LIMIT = 1 << 20


def request(*inputs: dict, **extra: object) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **extra})


def tensor(**fields: object) -> dict:
    return {"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0], **fields}


def test_a_valid_request_decodes() -> None:
    parsed = v2json.parse(
        request(
            tensor(shape=[2, 2], data=[[1, 2], [3, 4]]),
            tensor(name="s", datatype="BYTES", shape=[1], data=["hé"]),
            tensor(name="b", datatype="BOOL", shape=[2], data=[True, False]),
            outputs=[{"name": "y"}],
            id="abc",
        ),
        LIMIT,
    )
    np.testing.assert_array_equal(parsed.inputs["x"], np.array([[1, 2], [3, 4]], np.float32))
    assert parsed.inputs["s"].tolist() == ["hé".encode()]
    assert parsed.inputs["b"].dtype == bool and parsed.outputs == ["y"] and parsed.id == "abc"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[1, 2]", "must be a JSON object"),
        (b"{not json", "not JSON"),
        (orjson.dumps({"inputs": 5}), "'inputs' must be a non-empty list"),
        (request(), "'inputs' must be a non-empty list"),
        (request(*[tensor(name=f"x{i}") for i in range(65)]), "more than the limit of 64"),
        (request(5), "must be an object"),
        (request(tensor(name={"a": 1})), "'name' must be a non-empty string"),
        (request(tensor(name="n" * 300)), "longer than 256"),
        (request(tensor(datatype=["FP32"])), "'datatype' must be one of"),
        (request(tensor(datatype="FP128")), "'datatype' must be one of"),
        (request(tensor(datatype="FP16")), "FP16 cannot travel as JSON"),
        (request(tensor(shape="2")), "'shape' must be a list"),
        (request(tensor(shape=[-1])), "'shape' must be a list"),
        (request(tensor(shape=[True, 2])), "'shape' must be a list"),
        (request(tensor(shape=[1] * 9)), "at most 8"),
        (
            request(tensor(shape=[0, 10**12], data=[])),
            "spans 1000000000000 elements",
        ),
        (request(tensor(shape=[2**14, 2**15], data=[])), "more than the limit"),
        (request(tensor(data=[1.0])), "1 values do not fill shape [2]"),
        (request(tensor(data=[1.0, 2.0, 3.0])), "more values in 'data'"),
        (request(tensor(data="12")), "'data' must be a list"),
        (request(tensor(data=[1.0, None])), "holds a NoneType"),
        (request(tensor(data=[1.0, {"a": 1}])), "holds a dict"),
        (request(tensor(data=[1.0, "2"])), "FP32 elements must be JSON numbers"),
        (request(tensor(data=[1.0, -1e39])), "does not fit FP32"),  # not -infinity
        (request(tensor(datatype="INT32", data=[1, 2.5])), "INT32 elements must be JSON integers"),
        (request(tensor(datatype="INT32", data=[1, True])), "must be JSON integers"),
        (request(tensor(datatype="UINT8", data=[1, 300])), "does not fit UINT8"),
        (request(tensor(datatype="UINT8", data=[1, -1])), "does not fit UINT8"),
        (request(tensor(datatype="BOOL", data=[1, 0])), "must be JSON booleans"),
        (request(tensor(datatype="BYTES", shape=[1], data=[1500000000])), "must be strings"),
        (request(tensor(), tensor()), "a second input named 'x'"),
        (request(tensor(), outputs=5), "'outputs' must be a list"),
        (request(tensor(), outputs=[5]), "outputs[0] must be an object"),
        (request(tensor(), outputs=[{"name": 5}]), "'name' must be a non-empty string"),
        (request(tensor(), id=7), "'id' must be a string"),
    ],
)
def test_malformed_requests_are_named(body: bytes, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        v2json.parse(body, LIMIT)
    assert message in str(info.value)


def test_tensors_may_not_add_up_to_more_than_the_body_limit() -> None:
    big = tensor(datatype="FP64", shape=[100_000], data=[0.0] * 100_000)  # 800 KB decoded
    with pytest.raises(InvalidInput, match="more than the body limit"):
        v2json.parse(request(big, dict(big, name="y")), LIMIT)


def test_a_tiny_hostile_request_allocates_nothing_large() -> None:
    """The 88-byte request that made the proxy allocate 1.5 GB of zeros."""
    hostile = request(tensor(datatype="BYTES", shape=[1], data=[1_500_000_000]))
    assert len(hostile) < 100
    tracemalloc.start()
    try:
        with pytest.raises(InvalidInput):
            v2json.parse(hostile, LIMIT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "inputs": st.lists(
                st.dictionaries(
                    st.sampled_from(["name", "shape", "datatype", "data", "parameters"]),
                    json_values,
                ),
                max_size=3,
            )
        },
        optional={"outputs": json_values, "id": json_values},
    )
)
def test_any_json_is_parsed_or_refused_cleanly(body: dict) -> None:
    with contextlib.suppress(InvalidInput):
        v2json.parse(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), LIMIT)
