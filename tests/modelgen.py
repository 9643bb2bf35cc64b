"""Small real ONNX models (built with onnx.helper) and a repository holding them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]
IR_VERSION = 9  # what onnxruntime of this era loads

TYPES = {
    "b": TensorProto.BOOL,
    "u8": TensorProto.UINT8,
    "u16": TensorProto.UINT16,
    "u32": TensorProto.UINT32,
    "u64": TensorProto.UINT64,
    "i8": TensorProto.INT8,
    "i16": TensorProto.INT16,
    "i32": TensorProto.INT32,
    "i64": TensorProto.INT64,
    "f16": TensorProto.FLOAT16,
    "f32": TensorProto.FLOAT,
    "f64": TensorProto.DOUBLE,
    "s": TensorProto.STRING,
}

LINEAR_IN, LINEAR_OUT = 4, 3


def linear_weights(version: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(version)
    w = rng.normal(size=(LINEAR_IN, LINEAR_OUT)).astype(np.float32)
    b = np.full(LINEAR_OUT, float(version), dtype=np.float32)
    return w, b


def linear_model(version: int) -> onnx.ModelProto:
    """y = x @ W_v + b_v, label = argmax(y): a different answer per version."""
    w, b = linear_weights(version)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "B"], ["y"]),
            helper.make_node("ArgMax", ["y"], ["label"], axis=1, keepdims=0),
        ],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", LINEAR_IN])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", LINEAR_OUT]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
        ],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=IR_VERSION)


def types_model() -> onnx.ModelProto:
    """Identity for every v2 datatype: input `<t>` comes back as output `out_<t>`."""
    nodes = [helper.make_node("Identity", [k], [f"out_{k}"]) for k in TYPES]
    graph = helper.make_graph(
        nodes,
        "types",
        [helper.make_tensor_value_info(k, t, [-1]) for k, t in TYPES.items()],
        [helper.make_tensor_value_info(f"out_{k}", t, [-1]) for k, t in TYPES.items()],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=IR_VERSION)


SLOW_WIDTH, SLOW_DEPTH = 512, 16


def slow_model() -> onnx.ModelProto:
    """A chain of 512x512 MatMuls: its cost grows with the rows sent (for timing tests)."""
    w = (np.eye(SLOW_WIDTH, dtype=np.float32) * 0.999).astype(np.float32)
    names = ["x"] + [f"h{i}" for i in range(SLOW_DEPTH - 1)] + ["y"]
    nodes = [helper.make_node("MatMul", [names[i], "W"], [names[i + 1]]) for i in range(SLOW_DEPTH)]
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", SLOW_WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", SLOW_WIDTH])],
        [numpy_helper.from_array(w, "W")],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=IR_VERSION)


def ragged_model() -> onnx.ModelProto:
    """Sequences [N, T, 2]: `running` sums along T, `total` is the last of them. Padding
    counted by mistake would show in both."""
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    graph = helper.make_graph(
        [
            helper.make_node("CumSum", ["x", "axis"], ["running"]),
            helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=0),
        ],
        "ragged",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 2])],
        [
            helper.make_tensor_value_info("running", TensorProto.FLOAT, ["N", "T", 2]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, ["N", 2]),
        ],
        [axis, axes],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=IR_VERSION)


def _write(root: Path, name: str, version: int, model: onnx.ModelProto, config: dict) -> None:
    folder = root / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    onnx.checker.check_model(model)
    onnx.save(model, folder / str(version) / "model.onnx")
    (folder / "config.yaml").write_text(yaml.safe_dump(config))


def build_test_repository(root: Path) -> Path:
    for v in (1, 2, 3):
        _write(
            root,
            "linear",
            v,
            linear_model(v),
            {
                "labels": "labels.txt",
                "max_batch_size": 16,
                "dynamic_batching": {"max_queue_delay_ms": 20},
                "version_policy": {"latest": 2},
                "onnxruntime": {"intra_op_threads": 1},
            },
        )
    (root / "linear" / "labels.txt").write_text("cat\ndog\nemu\n")
    _write(root, "types", 1, types_model(), {})
    _write(
        root,
        "ragged",
        1,
        ragged_model(),
        {
            "max_batch_size": 8,
            "ragged": {"input": "x", "axis": 1, "lengths": "lengths", "outputs": {"running": 1}},
            "onnxruntime": {"intra_op_threads": 1},
        },
    )
    _write(
        root,
        "slow",
        1,
        slow_model(),
        {
            "max_batch_size": 4096,
            "onnxruntime": {"intra_op_threads": 1},
        },
    )
    return root
