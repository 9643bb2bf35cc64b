"""Scalar affine steps folded into the convolutions beside them, at model-build time.

PP-LCNetV3 (the backbone of PP-OCRv4's detector and recogniser) follows its convolutions
and activations with a "learnable affine block": `y * s + b`, `s` and `b` one number each,
exported as a Mul and an Add. Each is a pass over the whole activation tensor: in the
recogniser, the Muls and Adds took 22% of the model's time (onnxruntime's profiler, a
48x960 line, one thread), while onnxruntime's own Conv-Mul/Add fusions leave scalars out.

Two foldings, exact in real arithmetic (the float rounding of a product moves, no more):
- after a convolution: `conv(x; W, B) * s + b = conv(x; W*s, B*s + b)`;
- before a convolution that pads nothing: `conv(h * s + b; W, B) = conv(h; W*s, B + b *
  sum(W[o]))`, the sum over each output channel's whole kernel (its group's input channels
  and every tap).
Before a convolution that pads, the border taps would see 0 where `b` was: there the Mul and
Add become one 1x1 convolution of a channel a group (`x * s + b` still). One pass over the
tensor instead of two, and it keeps onnxruntime's blocked layout (NCHWc) around it, where a
scalar Mul or Add made it convert the tensor out of that layout and back (its Reorder nodes
had taken 13% of the detector's time).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from models.onnx_edit import prune, scalar_constant


class _Graph:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.producer = {out: node for node in graph.node for out in node.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        self.outputs = {o.name for o in graph.output}
        self.initializers = {i.name: i for i in graph.initializer}

    def only_reader(self, name: str) -> onnx.NodeProto | None:
        readers = self.consumers[name]
        if len(readers) != 1 or name in self.outputs:
            return None
        return readers[0]

    def affine(self, mul: onnx.NodeProto) -> tuple[str, float, float, onnx.NodeProto] | None:
        """(x, s, b, the Add) when `mul` is `x * s` read only by an Add of a scalar `b`."""
        if mul.op_type != "Mul" or len(mul.input) != 2:
            return None
        scales = [(i, scalar_constant(self.graph, n)) for i, n in enumerate(mul.input)]
        known = [(i, s) for i, s in scales if s is not None]
        if len(known) != 1:
            return None
        index, s = known[0]
        add = self.only_reader(mul.output[0])
        if add is None or add.op_type != "Add" or len(add.input) != 2:
            return None
        other = add.input[1] if add.input[0] == mul.output[0] else add.input[0]
        b = scalar_constant(self.graph, other)
        if b is None:
            return None
        return mul.input[1 - index], s, b, add

    def weights(self, conv: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray] | None:
        """A convolution's own weight and bias (zeros when it has none), or None when they
        are not initializers read by it alone."""
        names = list(conv.input[1:3])
        if any(n not in self.initializers or len(self.consumers[n]) != 1 for n in names):
            return None
        weight = numpy_helper.to_array(self.initializers[names[0]]).astype(np.float32)
        if len(names) == 2:
            bias = numpy_helper.to_array(self.initializers[names[1]]).astype(np.float32)
        else:
            bias = np.zeros(weight.shape[0], np.float32)
        return weight, bias

    def set_weights(self, conv: onnx.NodeProto, weight: np.ndarray, bias: np.ndarray) -> None:
        self.initializers[conv.input[1]].CopyFrom(numpy_helper.from_array(weight, conv.input[1]))
        if len(conv.input) > 2:
            self.initializers[conv.input[2]].CopyFrom(numpy_helper.from_array(bias, conv.input[2]))
        else:
            name = f"{conv.name or conv.output[0]}_folded_bias"
            init = numpy_helper.from_array(bias, name)
            self.graph.initializer.append(init)
            self.initializers[name] = self.graph.initializer[-1]
            conv.input.append(name)

    def channelwise(
        self, add: onnx.NodeProto, x: str, s: float, b: float, channels: int
    ) -> onnx.NodeProto:
        """`x * s + b` as a 1x1 convolution of one channel a group, in `add`'s place."""
        name = f"{add.name or add.output[0]}_channelwise"
        weight = np.full((channels, 1, 1, 1), s, np.float32)
        bias = np.full(channels, b, np.float32)
        for suffix, value in (("w", weight), ("b", bias)):
            self.graph.initializer.append(numpy_helper.from_array(value, f"{name}_{suffix}"))
        return helper.make_node(
            "Conv",
            [x, f"{name}_w", f"{name}_b"],
            [add.output[0]],
            name=name,
            group=channels,
            kernel_shape=[1, 1],
        )


def _constants_to_initializers(graph: onnx.GraphProto) -> None:
    """The exporter's Constant nodes (weights among them) become initializers, as
    onnxruntime makes them when it loads the model: one place to read and rewrite them."""
    constants = [
        n for n in graph.node if n.op_type == "Constant" and n.attribute[0].name == "value"
    ]
    for node in constants:
        graph.initializer.append(
            numpy_helper.from_array(numpy_helper.to_array(node.attribute[0].t), node.output[0])
        )
        graph.node.remove(node)


def _in_channels(g: _Graph, conv: onnx.NodeProto) -> int | None:
    weight = g.initializers.get(conv.input[1])
    if weight is None:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    return int(weight.dims[1] * attrs.get("group", 1))


def _pads_nothing(conv: onnx.NodeProto) -> bool:
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    return auto_pad in (b"NOTSET", b"VALID", "NOTSET", "VALID") and not any(attrs.get("pads", []))


@dataclass(frozen=True)
class Folds:
    folded: int
    """Affine steps folded into a convolution's weights."""
    channelwise: int
    """Affine steps before padded convolutions, made one channelwise 1x1 convolution."""


def fold_scalar_affine(model: onnx.ModelProto) -> tuple[onnx.ModelProto, Folds]:
    """Fold every scalar Mul-then-Add that follows a convolution, or that feeds only
    convolutions padding nothing, into their weights; one that feeds padded convolutions
    becomes a channelwise 1x1 convolution. Returns the model and how many of each."""
    _constants_to_initializers(model.graph)
    g = _Graph(model.graph)
    dropped: set[int] = set()
    replaced: dict[int, onnx.NodeProto] = {}
    folded = channelwise = 0
    for mul in list(model.graph.node):
        found = g.affine(mul)
        if found is None:
            continue
        x, s, b, add = found
        conv = g.producer.get(x)
        if conv is not None and conv.op_type == "Conv" and g.only_reader(x) is mul:
            weights = g.weights(conv)
            if weights is None:
                continue
            weight, bias = weights
            g.set_weights(conv, weight * np.float32(s), bias * np.float32(s) + np.float32(b))
            conv.output[0] = add.output[0]  # the Add's readers now read the convolution
            g.producer[add.output[0]] = conv
        else:
            readers = g.consumers[add.output[0]]
            if add.output[0] in g.outputs or not readers:
                continue
            if not all(r.op_type == "Conv" and r.input[0] == add.output[0] for r in readers):
                continue
            if not all(_pads_nothing(r) and g.weights(r) is not None for r in readers):
                channels = {_in_channels(g, r) for r in readers}
                if len(channels) != 1 or None in channels:
                    continue
                replaced[id(add)] = g.channelwise(add, x, s, b, channels.pop())  # type: ignore[arg-type]
                g.consumers[x] = [r for r in g.consumers[x] if r is not mul] + [replaced[id(add)]]
                dropped.add(id(mul))
                channelwise += 1
                continue
            for conv in readers:
                weight, bias = g.weights(conv)  # type: ignore[misc]
                per_output = weight.reshape(weight.shape[0], -1).sum(axis=1)
                g.set_weights(conv, weight * np.float32(s), bias + np.float32(b) * per_output)
                conv.input[0] = x
            g.consumers[x] = [r for r in g.consumers[x] if r is not mul] + readers
        dropped |= {id(mul), id(add)}
        folded += 1
    nodes = [replaced.get(id(n), n) for n in model.graph.node if id(n) not in dropped]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    prune(model.graph)
    return model, Folds(folded, channelwise)
