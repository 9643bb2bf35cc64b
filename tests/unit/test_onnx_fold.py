"""Scalar affine steps folded into convolutions (models/onnx_fold.py): the same answers,
fewer nodes; before a convolution that pads, a channelwise convolution instead."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from models import ocr
from models.build import DEFAULT_OUT
from models.onnx_fold import fold_scalar_affine

RNG = np.random.default_rng(7)


def _conv(name: str, x: str, out: str, cin: int, cout: int, k: int, group: int = 1, pad: int = 0):
    weight = RNG.normal(size=(cout, cin // group, k, k)).astype(np.float32)
    bias = RNG.normal(size=cout).astype(np.float32)
    # Weights as Constant nodes, as Paddle's exporter writes them.
    nodes = [
        helper.make_node("Constant", [], [f"{name}_w"], value=numpy_helper.from_array(weight)),
        helper.make_node("Constant", [], [f"{name}_b"], value=numpy_helper.from_array(bias)),
        helper.make_node(
            "Conv", [x, f"{name}_w", f"{name}_b"], [out], name=name, group=group, pads=[pad] * 4
        ),
    ]
    return nodes


def _affine(name: str, x: str, out: str, s: float, b: float):
    return [
        helper.make_node(
            "Constant", [], [f"{name}_s"], value=numpy_helper.from_array(np.array([s], np.float32))
        ),
        helper.make_node(
            "Constant", [], [f"{name}_k"], value=numpy_helper.from_array(np.array([b], np.float32))
        ),
        helper.make_node("Mul", [f"{name}_s", x], [f"{name}_m"]),
        helper.make_node("Add", [f"{name}_m", f"{name}_k"], [out]),
    ]


def _model() -> onnx.ModelProto:
    nodes = [
        *_conv("c1", "x", "c1_out", 4, 8, 3, pad=1),
        *_affine("a1", "c1_out", "a1_out", 1.7, -0.3),  # after a convolution: folded
        helper.make_node("HardSwish", ["a1_out"], ["h1"]),
        *_affine("a2", "h1", "a2_out", 0.6, 0.25),  # before a grouped 1x1 padding nothing
        *_conv("c2", "a2_out", "c2_out", 8, 8, 1, group=2),
        helper.make_node("HardSwish", ["c2_out"], ["h2"]),
        *_affine("a3", "h2", "a3_out", 1.2, 0.5),  # before a padded 3x3: left alone
        *_conv("c3", "a3_out", "y", 8, 8, 3, group=8, pad=1),
    ]
    graph = helper.make_graph(
        nodes,
        "folds",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 9, 11])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_folded_graph_answers_as_the_original() -> None:
    original = _model()
    folded, count = fold_scalar_affine(onnx.ModelProto.FromString(original.SerializeToString()))
    onnx.checker.check_model(folded)
    # Before the padded convolution the step cannot fold (its border taps would lose `b`):
    # it becomes a channelwise 1x1 convolution.
    assert (count.folded, count.channelwise) == (2, 1)
    ops = [n.op_type for n in folded.graph.node]
    assert ops.count("Mul") == 0 and ops.count("Add") == 0 and ops.count("Conv") == 4
    x = RNG.normal(size=(1, 4, 9, 11)).astype(np.float32)
    np.testing.assert_allclose(_run(folded, x), _run(original, x), rtol=1e-5, atol=1e-5)


def test_an_affine_read_elsewhere_too_is_not_folded() -> None:
    model = _model()
    # The first convolution's output also leaves the graph: folding would change it.
    model.graph.output.append(helper.make_tensor_value_info("c1_out", TensorProto.FLOAT, None))
    folded, count = fold_scalar_affine(model)
    assert (count.folded, count.channelwise) == (1, 1)
    assert "c1_out" in {o for n in folded.graph.node for o in n.output}


@pytest.mark.parametrize("name", ocr.NAMES)
def test_shipped_models_hold_no_foldable_step(name: str) -> None:
    """The built models were folded (test_onnx_edit.py checks they still answer as the
    originals in the wheel)."""
    _, left = fold_scalar_affine(onnx.load(str(DEFAULT_OUT / name / "1" / "model.onnx")))
    assert (left.folded, left.channelwise) == (0, 0)
