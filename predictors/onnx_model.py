"""One version of one ONNX model: an ONNX Runtime session, run by the server core."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument

from predictors import ragged, reported
from predictors.arena import Arena
from predictors.config import ModelConfig, ModelTensor
from protos.codec import dtype_of
from protos.errors import InvalidInput
from v2server.model import Scheduling, TensorSpec

ORT_TYPE_TO_DATATYPE = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def _specs(
    nodes: list, overrides: list[ModelTensor], where: str, kind: str, batching: bool
) -> tuple[TensorSpec, ...]:
    """The graph's tensors as the config declares them; the config checked against the
    graph first (names, datatypes, dims), each mismatch named by its field."""
    by_name = {o.name: o for o in overrides}
    unknown = set(by_name) - {n.name for n in nodes}
    if unknown:
        raise ValueError(
            f"{where}: config {kind} {sorted(unknown)} not in the graph "
            f"(its {kind}s: {', '.join(n.name for n in nodes)})"
        )
    specs = []
    for node in nodes:
        datatype = ORT_TYPE_TO_DATATYPE.get(node.type)
        if datatype is None:
            raise ValueError(f"{where}: tensor '{node.name}' has unsupported type {node.type}")
        shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in node.shape)
        override = by_name.get(node.name)
        bounds: dict[str, tuple[int, ...]] = {}
        if override is not None:
            field = f"{where}: {kind} '{node.name}'"
            if override.datatype is not None and override.datatype != datatype:
                raise ValueError(
                    f"{field}: data_type {override.datatype} in the config, the graph's is "
                    f"{datatype}"
                )
            if override.reshape is not None:
                _check_dims(
                    field,
                    "reshape",
                    [-1, *override.reshape] if batching else override.reshape,
                    shape,
                )
            elif override.shape is not None:
                _check_dims(field, "dims", override.shape, shape)
            shape = tuple(override.shape) if override.shape is not None else shape
            bounds = _bounds(field, override, len(shape), kind)
        specs.append(TensorSpec(node.name, datatype, shape, **bounds))
    return tuple(specs)


def _bounds(field: str, override: ModelTensor, rank: int, kind: str) -> dict[str, Any]:
    """An input's max_shape and multiple_of (one entry a dimension of its shape) and
    max_elements."""
    out: dict[str, Any] = {}
    if override.max_elements is not None:
        if kind != "input":
            raise ValueError(f"{field}: max_elements bounds what callers send; an {kind} has none")
        out["max_elements"] = override.max_elements
    for what in ("max_shape", "multiple_of"):
        given = getattr(override, what)
        if given is None:
            continue
        if kind != "input":
            raise ValueError(f"{field}: {what} bounds what callers send; an {kind} has none")
        if len(given) != rank:
            raise ValueError(
                f"{field}: {what} {given} in the config has {len(given)} dimensions, "
                f"the input has {rank} (batch dimension included)"
            )
        out[what] = tuple(given)
    return out


def _check_dims(field: str, what: str, declared: list[int], graph: tuple[int, ...]) -> None:
    """The config's shape (batch dimension included) against the graph's: the same rank, and
    each dimension the graph fixes fixed to the same size."""
    agree = len(declared) == len(graph) and all(
        g == -1 or d == g for d, g in zip(declared, graph, strict=True)
    )
    if not agree:
        raise ValueError(
            f"{field}: {what} {list(declared)} in the config (batch dimension included), the "
            f"graph's shape is {list(graph)}"
        )


def session_options(config: ModelConfig) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = config.onnxruntime.intra_op_threads
    options.inter_op_num_threads = config.onnxruntime.inter_op_threads
    options.graph_optimization_level = _OPT_LEVELS[config.onnxruntime.graph_optimization_level]
    options.log_severity_level = 3
    spin = "1" if config.onnxruntime.allow_spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    return options


class OnnxModel:
    platform = "onnxruntime_onnx"

    def __init__(
        self,
        name: str,
        version: int,
        path: Path,
        config: ModelConfig,
        label_files: dict[str, list[str]] | None = None,
    ) -> None:
        self.name = name
        self.version = str(version)
        self.config = config
        where = f"{name}/{version}"
        self._session = ort.InferenceSession(
            str(path), session_options(config), providers=["CPUExecutionProvider"]
        )
        policy = config.onnxruntime.arena
        self._arena = Arena(policy) if policy != "keep" else None
        batching = config.max_batch_size > 0
        nodes_in, nodes_out = self._session.get_inputs(), self._session.get_outputs()
        self.inputs = _specs(nodes_in, config.inputs, where, "input", batching)
        self.outputs = _specs(nodes_out, config.outputs, where, "output", batching)
        files = label_files or {}
        counts = {name: len(lines) for name, lines in files.items()}
        self._label_files = reported.assign_labels(config, self.outputs, counts, where)
        self.labels = {out: files[file] for out, file in self._label_files.items()}
        """Class names by output, used by the classification extension."""
        if config.ragged is not None:
            self.inputs = (*self.inputs, _ragged_lengths(config, self.inputs, self.outputs, where))
        self._output_names = [s.name for s in self.outputs]
        self._string_inputs = {s.name for s in self.inputs if s.datatype == "BYTES"}
        self._reshape_in = {
            t.name: tuple(t.reshape) for t in config.inputs if t.reshape is not None
        }
        self._reshape_out = {  # back to the declared shape, rows apart when batching
            t.name: tuple(t.shape[1:] if config.max_batch_size else t.shape)
            for t in config.outputs
            if t.reshape is not None
        }
        self.reported_config = reported.config(
            name, config, self.inputs, self.outputs, self._label_files
        )
        """The Triton config this model reports: the one it serves (reported.py)."""
        batching = config.dynamic_batching
        self.scheduling = Scheduling(
            max_batch_size=config.max_batch_size,
            max_queue_delay_s=batching.max_queue_delay_ms / 1000 if batching else None,
            preferred_batch_size=max(batching.preferred_batch_size, default=0) if batching else 0,
            instances=config.instance_count,
            max_queue=config.max_queue_size,
            inline_below_s=config.inline_below_ms / 1000,
        )

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One synchronous execution (called from the executor): one ONNX Runtime call,
        or one per row for a `ragged` model."""
        if self.config.ragged is not None:
            return ragged.run_rows(self.name, self.config.ragged, inputs, self._run_once)
        return self._run_once(inputs)

    def _run_once(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._reshape_in:
            inputs = {
                name: self._reshaped(name, arr, self._reshape_in.get(name))
                for name, arr in inputs.items()
            }
        feeds = {
            # ONNX Runtime wants str elements for string tensors; v2 BYTES carry bytes.
            # Zero-copy decoded tensors may sit unaligned in the received buffer.
            name: np.vectorize(_to_str, otypes=[object])(arr)
            if name in self._string_inputs
            else np.require(arr, requirements=["A", "C"])
            for name, arr in inputs.items()
        }
        try:
            options = None
            if self._arena is not None:
                options = self._arena.run_options(sum(a.nbytes for a in feeds.values()))
            results = self._session.run(self._output_names, feeds, options)
        except OrtInvalidArgument as exc:
            raise InvalidInput(f"model '{self.name}': {exc}") from None
        outputs = dict(zip(self._output_names, results, strict=True))
        for name, shape in self._reshape_out.items():
            outputs[name] = self._reshaped(name, outputs[name], shape)
        return outputs

    def _reshaped(self, name: str, arr: np.ndarray, shape: tuple[int, ...] | None) -> np.ndarray:
        """Triton's `reshape`: the same elements in the other shape (rows kept apart)."""
        if shape is None:
            return arr
        rows = (arr.shape[0],) if self.config.max_batch_size else ()
        try:
            return arr.reshape(rows + shape)
        except ValueError:
            raise InvalidInput(
                f"model '{self.name}': '{name}' of shape {list(arr.shape)} cannot be reshaped "
                f"to {list(rows + shape)}"
            ) from None

    def warmup_inputs(self) -> dict[str, np.ndarray]:
        feeds = {}
        rng = np.random.default_rng(0)
        for spec in self.inputs:
            shape = self.config.warmup.get(spec.name) or [1 if d < 0 else d for d in spec.shape]
            if spec.datatype == "BYTES":
                feeds[spec.name] = np.full(shape, b"", dtype=object)
            elif spec.name in self.config.warmup_random:
                dtype = dtype_of(spec.datatype)
                values = rng.random(shape) if dtype.kind == "f" else rng.integers(0, 2, shape)
                feeds[spec.name] = values.astype(dtype)
            else:
                feeds[spec.name] = np.zeros(shape, dtype=dtype_of(spec.datatype))
        spec = self.config.ragged
        if spec is not None:  # every row at the padded length
            padded = feeds[spec.input]
            feeds[spec.lengths] = np.full(padded.shape[0], padded.shape[spec.axis], np.int32)
        return feeds


def _ragged_lengths(
    config: ModelConfig,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    where: str,
) -> TensorSpec:
    """The extra input of a `ragged` model, after checking the config against the graph."""
    spec = config.ragged
    assert spec is not None
    names = {s.name: s for s in inputs}
    if spec.input not in names:
        raise ValueError(f"{where}: ragged.input '{spec.input}' is not an input of the graph")
    if spec.axis >= len(names[spec.input].shape):
        raise ValueError(f"{where}: ragged.axis {spec.axis} is beyond '{spec.input}'")
    if spec.lengths in names:
        raise ValueError(f"{where}: ragged.lengths '{spec.lengths}' is an input of the graph")
    unknown = set(spec.outputs) - {s.name for s in outputs}
    if unknown:
        raise ValueError(
            f"{where}: ragged.outputs names outputs the graph lacks: {sorted(unknown)}"
        )
    return TensorSpec(spec.lengths, "INT32", (-1,))


def _to_str(item: object) -> str:
    return item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)
