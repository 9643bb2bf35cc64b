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


def channel_means_model() -> onnx.ModelProto:
    """An image [1, 3, H, W] -> its channels' means [1, 3, 1, 1] (Triton's densenet example
    in small: callers send [3, H, W] and get [3], the config's `reshape` does the rest)."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["data_0"], ["fc6_1"], axes=[2, 3], keepdims=1)],
        "channel_means",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, 3, 1, 1])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


# The layout and config.pbtxt files of Triton's model repository documentation, for ONNX
# models: <model>/config.pbtxt, <model>/<version>/model.onnx.
LINEAR_PBTXT = """\
name: "linear_triton"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { latest: { num_versions: 1 } }
input [
  {
    name: "x"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "y"
    data_type: TYPE_FP32
    dims: [ 3 ]
    label_filename: "labels.txt"
  },
  {
    name: "label"
    data_type: TYPE_INT64
    dims: [ ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 500
  default_queue_policy { max_queue_size: 64 }
}
instance_group [
  {
    count: 2
    kind: KIND_CPU
  }
]
model_warmup [
  {
    name: "zeros"
    batch_size: 2
    inputs {
      key: "x"
      value: {
        data_type: TYPE_FP32
        dims: [ 4 ]
        random_data: true
      }
    }
  }
]
"""

DENSENET_STYLE_PBTXT = """\
name: "channel_means"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 4, 4 ]
    reshape { shape: [ 1, 3, 4, 4 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 3 ]
    reshape { shape: [ 1, 3, 1, 1 ] }
  }
]
"""


def simple_model() -> onnx.ModelProto:
    """Triton's `simple` example model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    spec = [-1, 16]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "simple",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, spec) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, spec) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


# As Triton's own tests write the `simple` model's config (qa/python_models, docs): labels on
# OUTPUT0 only, a specific version, a warm-up sample, a queue bound.
SIMPLE_PBTXT = """name: "simple"
backend: "onnxruntime"
max_batch_size: 8
version_policy: { specific: { versions: [ 2 ] } }
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    format: FORMAT_NONE
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 16 ]
    label_filename: "output0_labels.txt"
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 2, 4 ]
  max_queue_delay_microseconds: 100
  default_queue_policy { max_queue_size: 32 }
}
model_warmup [
  {
    name: "zero_value"
    batch_size: 1
    inputs {
      key: "INPUT0"
      value: {
        data_type: TYPE_FP32
        dims: [ 16 ]
        zero_data: true
      }
    }
    inputs {
      key: "INPUT1"
      value: {
        data_type: TYPE_FP32
        dims: [ 16 ]
        zero_data: true
      }
    }
  }
]
"""


def build_triton_repository(root: Path) -> Path:
    """Two models configured as Triton's documentation shows (config.pbtxt)."""
    for v in (1, 2):
        folder = root / "linear_triton" / str(v)
        folder.mkdir(parents=True)
        onnx.save(linear_model(v), folder / "model.onnx")
    (root / "linear_triton" / "config.pbtxt").write_text(LINEAR_PBTXT)
    (root / "linear_triton" / "labels.txt").write_text("cat\ndog\nemu\n")
    (root / "channel_means" / "1").mkdir(parents=True)
    onnx.save(channel_means_model(), root / "channel_means" / "1" / "model.onnx")
    (root / "channel_means" / "config.pbtxt").write_text(DENSENET_STYLE_PBTXT)
    for v in (1, 2):
        (root / "simple" / str(v)).mkdir(parents=True)
        onnx.save(simple_model(), root / "simple" / str(v) / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_PBTXT)
    labels = "".join(f"label{i}\n" for i in range(16))
    (root / "simple" / "output0_labels.txt").write_text(labels)
    return root
