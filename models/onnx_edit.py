"""Edits of ONNX graphs made at model-build time; none of them changes a weight.

- `image_input`: the model takes UINT8 images (NHWC, as decoded) and does the cast, the
  layout change and the normalisation itself, so a hop carries bytes, not 4x as many floats.
- `fuse_hard_swish`: `x * clip(x + 3, 0, 6) / 6`, spelled as four nodes by the Paddle
  exporter, becomes ONNX's HardSwish (one kernel, one pass over memory).
- `argmax_outputs`: a classifier's per-step probabilities become the best index and its
  probability per step: what a greedy decoder reads, a few bytes instead of thousands of
  floats per step; plus, where asked, the probability of chosen classes at every step (the
  recogniser's space: a word gap the best path gives to the blank still shows there).
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, version_converter


def scalar_constant(graph: onnx.GraphProto, name: str) -> float | None:
    """The value of a one-element initializer or Constant node, or None."""
    for init in graph.initializer:
        if init.name == name:
            value = numpy_helper.to_array(init)
            return float(value.reshape(-1)[0]) if value.size == 1 else None
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name and node.attribute:
            value = numpy_helper.to_array(node.attribute[0].t)
            return float(value.reshape(-1)[0]) if value.size == 1 else None
    return None


def prune(graph: onnx.GraphProto) -> None:
    """Drop Constant nodes and initializers that no node reads any more."""
    while True:
        used = {name for node in graph.node for name in node.input}
        used |= {o.name for o in graph.output}
        dead = [n for n in graph.node if n.op_type == "Constant" and n.output[0] not in used]
        for node in dead:
            graph.node.remove(node)
        if not dead:
            break
    keep = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)


def fuse_hard_swish(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Replace every Add(x,3) -> Clip(0,6) -> Mul(x,.) -> Div(.,6) chain by HardSwish(x).

    HardSwish needs opset 14: an older model is converted first. Returns the model and the
    number of chains replaced.
    """
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 14:
        model = version_converter.convert_version(model, 14)
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    replaced: dict[int, onnx.NodeProto] = {}
    dropped: set[int] = set()
    for clip in graph.node:
        if clip.op_type != "Clip" or len(clip.input) != 3:
            continue
        add = producer.get(clip.input[0])
        if add is None or add.op_type != "Add" or scalar_constant(graph, add.input[1]) != 3:
            continue
        if (scalar_constant(graph, clip.input[1]), scalar_constant(graph, clip.input[2])) != (0, 6):
            continue
        x = add.input[0]
        muls = consumers[clip.output[0]]
        if len(muls) != 1 or muls[0].op_type != "Mul" or set(muls[0].input) != {x, clip.output[0]}:
            continue
        mul = muls[0]
        divs = consumers[mul.output[0]]
        if len(divs) != 1 or divs[0].op_type != "Div":
            continue
        div = divs[0]
        if scalar_constant(graph, div.input[1]) != 6:
            continue
        if len(consumers[add.output[0]]) != 1:
            continue
        dropped |= {id(add), id(clip), id(mul)}
        replaced[id(div)] = helper.make_node(
            "HardSwish", [x], [div.output[0]], name=f"{div.name}_hard_swish"
        )
    nodes = [replaced.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    prune(graph)
    return model, len(replaced)


def image_input(model: onnx.ModelProto, scale: float, offset: float) -> onnx.ModelProto:
    """The first input, an FP32 NCHW tensor, becomes a UINT8 NHWC image of the same name;
    the graph computes `float(pixel) * scale + offset` and the transpose itself."""
    graph = model.graph
    original = graph.input[0]
    name = original.name
    dims = original.type.tensor_type.shape.dim
    n, c, h, w = (d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)
    inner = f"{name}_normalised"
    for node in graph.node:
        node.input[:] = [inner if i == name else i for i in node.input]
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(scale, np.float32), f"{name}_scale"),
            numpy_helper.from_array(np.array(offset, np.float32), f"{name}_offset"),
        ]
    )
    prologue = [
        helper.make_node("Cast", [name], [f"{name}_float"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", [f"{name}_float"], [f"{name}_nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Mul", [f"{name}_nchw", f"{name}_scale"], [f"{name}_scaled"]),
        helper.make_node("Add", [f"{name}_scaled", f"{name}_offset"], [inner]),
    ]
    nodes = [*prologue, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.input.remove(original)
    graph.input.insert(0, helper.make_tensor_value_info(name, TensorProto.UINT8, [n, h, w, c]))
    return model


def argmax_outputs(
    model: onnx.ModelProto,
    index_name: str = "index",
    prob_name: str = "prob",
    classes: dict[str, int] | None = None,
) -> onnx.ModelProto:
    """The only output, probabilities [N, T, C], becomes the best class per step
    (`index`, INT64 [N, T]) and its probability (`prob`, FP32 [N, T]); each of `classes`
    (output name -> class) that class's probability per step (FP32 [N, T])."""
    graph = model.graph
    (probs,) = graph.output
    dims = [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
        for d in probs.type.tensor_type.shape.dim
    ][:2]
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset >= 18:
        axes = helper.make_tensor(f"{prob_name}_axes", TensorProto.INT64, [1], [2])
        graph.initializer.append(axes)
        reduce_max = helper.make_node("ReduceMax", [probs.name, axes.name], [prob_name], keepdims=0)
    else:
        reduce_max = helper.make_node("ReduceMax", [probs.name], [prob_name], axes=[2], keepdims=0)
    graph.node.extend(
        [helper.make_node("ArgMax", [probs.name], [index_name], axis=2, keepdims=0), reduce_max]
    )
    graph.output.remove(probs)
    graph.output.extend(
        [
            helper.make_tensor_value_info(index_name, TensorProto.INT64, dims),
            helper.make_tensor_value_info(prob_name, TensorProto.FLOAT, dims),
        ]
    )
    for name, cls in (classes or {}).items():
        # Gather with a scalar index drops the class axis: [N, T, C] -> [N, T].
        graph.initializer.append(helper.make_tensor(f"{name}_class", TensorProto.INT64, [], [cls]))
        graph.node.append(helper.make_node("Gather", [probs.name, f"{name}_class"], [name], axis=2))
        graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
    return model
