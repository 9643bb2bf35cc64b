"""A `ragged` model: rows of a padded batch run alone, each cut to its own length."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml

from predictors.config import ConfigError
from predictors.repository import discover
from protos import messages, pb, pb_grpc
from protos.errors import InvalidInput
from tests.modelgen import build_test_repository
from v2server.validation import check_declared

TIMEOUT = 10.0


def infer(stub: pb_grpc.GRPCInferenceServiceStub, inputs: dict) -> dict:
    request = messages.build_request("ragged", inputs)
    return messages.response_outputs(stub.ModelInfer(request, timeout=TIMEOUT))


def test_metadata_lists_the_lengths_input(
    predictor_stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    meta = predictor_stub.ModelMetadata(pb.ModelMetadataRequest(name="ragged"), timeout=TIMEOUT)
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("x", "FP32", [-1, -1, 2]),
        ("lengths", "INT32", [-1]),
    ]


def test_each_row_answers_as_if_alone(predictor_stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """Padding holds junk (99s); no answer may see it, and the growing output comes back
    padded with zeros to the longest row."""
    rng = np.random.default_rng(0)
    lengths = np.array([3, 7, 1, 5], np.int32)
    rows = [rng.normal(size=(n, 2)).astype(np.float32) for n in lengths]
    padded = np.full((4, 7, 2), 99, np.float32)
    for i, row in enumerate(rows):
        padded[i, : len(row)] = row
    out = infer(predictor_stub, {"x": padded, "lengths": lengths})
    assert out["running"].shape == (4, 7, 2) and out["total"].shape == (4, 2)
    for i, row in enumerate(rows):
        alone = infer(predictor_stub, {"x": row[np.newaxis], "lengths": lengths[i : i + 1]})
        np.testing.assert_allclose(out["total"][i], alone["total"][0], rtol=1e-6)
        np.testing.assert_allclose(out["total"][i], row.sum(axis=0), rtol=1e-5)
        np.testing.assert_allclose(out["running"][i, : len(row)], np.cumsum(row, axis=0), rtol=1e-5)
        assert not out["running"][i, len(row) :].any()


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        (np.array([3, 8], np.int32), "lengths outside 1..7"),
        (np.array([0, 2], np.int32), "lengths outside 1..7"),
        (np.array([3], np.int32), "inputs disagree on batch size"),
        (np.array([3, 2], np.int64), "expected datatype INT32"),
    ],
)
def test_bad_lengths_are_named(
    predictor_stub: pb_grpc.GRPCInferenceServiceStub, lengths: np.ndarray, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        infer(predictor_stub, {"x": np.zeros((2, 7, 2), np.float32), "lengths": lengths})
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (info.value.details() or "")


@pytest.mark.parametrize(
    ("ragged", "message"),
    [
        ({"input": "y", "axis": 1, "lengths": "n", "outputs": {"running": 1}}, "not an input"),
        ({"input": "x", "axis": 3, "lengths": "n", "outputs": {"running": 1}}, "beyond 'x'"),
        ({"input": "x", "axis": 1, "lengths": "x", "outputs": {"running": 1}}, "is an input"),
        ({"input": "x", "axis": 1, "lengths": "n", "outputs": {"sum": 1}}, "['sum']"),
    ],
)
def test_a_ragged_config_that_does_not_fit_the_graph_stops_start_up(
    tmp_path: Path, ragged: dict, message: str
) -> None:
    root = build_test_repository(tmp_path)
    config = yaml.safe_load((root / "ragged" / "config.yaml").read_text())
    (root / "ragged" / "config.yaml").write_text(yaml.safe_dump({**config, "ragged": ragged}))
    with pytest.raises(ConfigError, match="ragged") as info:
        discover(root, ["ragged"])
    assert message in str(info.value)


def bounded(tmp_path: Path, **x: list[int]) -> Path:
    """The test repository with bounds on the `ragged` model's input `x` ([-1, -1, 2])."""
    root = build_test_repository(tmp_path)
    path = root / "ragged" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**config, "inputs": [{"name": "x", **x}]}))
    return root


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((1, 9, 2), "dimension 1 is 9, more than the model takes (8; largest shape [4, 8, -1]"),
        ((5, 2, 2), "dimension 0 is 5, more than the model takes (4"),
        ((1, 3, 2), "dimension 1 is 3, not a multiple of 2"),
        ((3, 8, 2), "shape [3, 8, 2] is 48 elements, more than the model takes (40)"),
    ],
)
def test_an_input_past_its_declared_bounds_is_refused_naming_them(
    tmp_path: Path, shape: tuple[int, ...], message: str
) -> None:
    """`max_shape`, `max_elements` and `multiple_of` on an input are checked with its shape,
    before any of it is decoded; within them the model runs as before."""
    root = bounded(tmp_path, max_shape=[4, 8, -1], multiple_of=[1, 2, -1], max_elements=40)
    (model,) = discover(root, ["ragged"])
    spec = next(s for s in model.inputs if s.name == "x")
    assert (spec.max_shape, spec.multiple_of, spec.max_elements) == ((4, 8, -1), (1, 2, -1), 40)
    lengths = ("lengths", "INT32", [shape[0]])
    with pytest.raises(InvalidInput, match=re.escape(message)):
        check_declared("ragged", model.inputs, [("x", "FP32", list(shape)), lengths])
    check_declared("ragged", model.inputs, [("x", "FP32", [2, 8, 2]), ("lengths", "INT32", [2])])


@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        ({"max_shape": [4, 8]}, "max_shape [4, 8] in the config has 2 dimensions, the input has 3"),
        ({"multiple_of": [1, 2, 1, 1]}, "multiple_of [1, 2, 1, 1] in the config has 4"),
        ({"max_elements": 0}, "max_elements\n  Input should be greater than 0"),
    ],
)
def test_bounds_that_do_not_fit_the_input_stop_start_up(
    tmp_path: Path, bounds: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        discover(bounded(tmp_path, **bounds), ["ragged"])
