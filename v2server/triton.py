"""Triton's extensions of the v2 protocol, rendered from what the server core knows:
model configuration, statistics, classification, the per-request `timeout` parameter."""

from __future__ import annotations

import numpy as np

from protos import pb
from protos.channels import STREAM_CANCEL_EXTENSION
from protos.codec import CONFIG_DATA_TYPE
from protos.decoded import MIN_PIXELS_PARAMETER
from protos.errors import InvalidInput
from protos.tracing import TRACE_EXTENSION
from v2server.model import Served, TensorSpec
from v2server.statistics import Compute, Duration

EXTENSIONS = [
    "classification",
    "model_configuration",
    "statistics",
    "system_shared_memory",
    STREAM_CANCEL_EXTENSION,
    TRACE_EXTENSION,
]
"""Protocol extensions this server implements (ServerMetadata lists them): Triton's, and
`stream_cancellation` (v2server/servicer.py: a streamed request cancelled by its id) and
`traceparent_parameter` (protos/tracing.py: a streamed request's trace context)."""


_BACKENDS = {"onnxruntime_onnx": "onnxruntime"}


DIGEST_PARAMETER = "mesh.sha256"
"""Reported in a model's configuration (ModelConfig.parameters): a digest of what decides its
answers (a predictor's files, a recipe's definition). The proxy's catalog reads the
configuration with the metadata, so a model changed without a new version or other tensors
(weights replaced in place, a recipe's parameters edited) is seen as changed: its cached
answers are never served for the new one."""


def model_config(model: Served) -> pb.ModelConfig:
    """Triton's view of a model: the config it was loaded from when it reports one (a
    predictor's `reported_config`: every honoured field as written, predictors/reported.py),
    else one built from what it serves; with max_batch_size > 0 dims leave out the batch."""
    reported = getattr(model, "reported_config", None)
    if reported is not None:
        return reported
    scheduling = model.scheduling
    config = pb.ModelConfig(
        name=model.name,
        platform=model.platform,
        backend=_BACKENDS.get(model.platform, ""),
        max_batch_size=scheduling.max_batch_size,
        input=[model_input(s, scheduling.max_batch_size) for s in model.inputs],
        output=[model_output(s, scheduling.max_batch_size) for s in model.outputs],
        instance_group=[
            pb.ModelInstanceGroup(
                name=model.name, kind=pb.ModelInstanceGroup.KIND_CPU, count=scheduling.instances
            )
        ],
    )
    if scheduling.max_queue_delay_s is not None:
        config.dynamic_batching.max_queue_delay_microseconds = round(
            scheduling.max_queue_delay_s * 1e6
        )
        if scheduling.preferred_batch_size:
            config.dynamic_batching.preferred_batch_size.append(scheduling.preferred_batch_size)
    if digest := getattr(model, "digest", None):
        config.parameters[DIGEST_PARAMETER].string_value = digest
    if decoding := getattr(model, "decoding", None):
        tensor, min_pixels = decoding
        config.parameters[MIN_PIXELS_PARAMETER + tensor].string_value = str(min_pixels)
    return config


def _dims(spec: TensorSpec, max_batch_size: int) -> tuple[list[int], bool]:
    """Dims as Triton writes them: without the batch dimension when the model batches, and a
    tensor with no other dimension as dims [1] reshaped to [] (Triton's own convention);
    True when that reshape applies."""
    dims = list(spec.shape[1:] if max_batch_size else spec.shape)
    if max_batch_size and not dims:
        return [1], True
    return dims, False


def model_input(spec: TensorSpec, max_batch_size: int) -> pb.ModelInput:
    dims, reshape = _dims(spec, max_batch_size)
    entry = pb.ModelInput(
        name=spec.name,
        data_type=CONFIG_DATA_TYPE.get(spec.datatype, pb.TYPE_INVALID),
        dims=dims,
        optional=spec.optional,
    )
    if reshape:
        entry.reshape.SetInParent()
    return entry


def model_output(spec: TensorSpec, max_batch_size: int) -> pb.ModelOutput:
    dims, reshape = _dims(spec, max_batch_size)
    entry = pb.ModelOutput(
        name=spec.name, data_type=CONFIG_DATA_TYPE.get(spec.datatype, pb.TYPE_INVALID), dims=dims
    )
    if reshape:
        entry.reshape.SetInParent()
    return entry


def _duration(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def model_statistics(model: Served) -> pb.ModelStatistics:
    stats = model.statistics
    compute = stats.compute
    return pb.ModelStatistics(
        name=model.name,
        version=model.version,
        last_inference=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(stats.success),
            fail=_duration(stats.fail),
            queue=_duration(stats.queue),
            compute_input=_duration(compute.input),
            compute_infer=_duration(compute.infer),
            compute_output=_duration(compute.output),
            cache_hit=_duration(stats.cache_hit),
            cache_miss=_duration(stats.cache_miss),
        ),
        batch_stats=[_batch(rows, stats.batches[rows]) for rows in sorted(stats.batches)],
    )


def _batch(rows: int, compute: Compute) -> pb.InferBatchStatistics:
    return pb.InferBatchStatistics(
        batch_size=rows,
        compute_input=_duration(compute.input),
        compute_infer=_duration(compute.infer),
        compute_output=_duration(compute.output),
    )


def classify(scores: np.ndarray, k: int, labels: list[str] | None) -> np.ndarray:
    """Triton's classification extension: the top k of each row as BYTES
    "value:index" (or "value:index:label" when the model has labels)."""
    if scores.ndim not in (1, 2) or scores.dtype.kind != "f":
        raise InvalidInput(
            f"classification needs a float [N, C] or [C] output, got "
            f"{scores.dtype} {list(scores.shape)}"
        )
    rows = scores.reshape(-1, scores.shape[-1])
    k = min(k, rows.shape[1])
    top = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    out = np.empty(top.shape, dtype=object)
    for r, c in np.ndindex(top.shape):
        index = int(top[r, c])
        text = f"{rows[r, index]:f}:{index}"
        if labels is not None and index < len(labels):
            text += f":{labels[index]}"
        out[r, c] = text.encode()
    return out if scores.ndim == 2 else out[0]


def with_request_timeout(request: pb.ModelInferRequest, remaining: float | None) -> float | None:
    """Triton's per-request `timeout` parameter (microseconds) shortens the call's deadline:
    a streamed request's only deadline besides the whole stream's."""
    param = request.parameters.get("timeout")
    kind = None if param is None else param.WhichOneof("parameter_choice")
    if kind is None:
        return remaining
    if kind != "int64_param" or param.int64_param < 0:
        raise InvalidInput("parameter 'timeout' must be a non-negative int64 (microseconds)")
    if param.int64_param == 0:
        return remaining
    own = param.int64_param / 1e6
    return own if remaining is None else min(own, remaining)
