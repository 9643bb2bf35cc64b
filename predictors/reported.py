"""The Triton config a predictor model reports (ModelConfig, over gRPC and the proxy's REST
door): the config it serves, every field it honours as written.

A model read from Triton's config.pbtxt reports that file's message, with only what Triton's
own auto-complete adds filled in (name, platform and backend, tensors the file leaves to the
graph, an instance group). A model configured in config.yaml reports the same fields
rendered from it. Class labels belong to the outputs that declare them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from predictors.config import ModelConfig
from protos import pb
from v2server import triton
from v2server.model import TensorSpec

PLATFORM, BACKEND = "onnxruntime_onnx", "onnxruntime"


def assign_labels(
    config: ModelConfig, outputs: Sequence[TensorSpec], counts: Mapping[str, int], where: str
) -> dict[str, str]:
    """Output name -> its label file: its own (`labels` on the output, Triton's
    `label_filename`), or the model's `labels` for every float output with as many entries
    in its last dimension as the file has lines (`counts`); ValueError when they fit none."""
    assigned = {t.name: t.labels for t in config.outputs if t.labels}
    if config.labels is not None:
        classes = counts[config.labels]
        fitting = [
            s.name
            for s in outputs
            if s.name not in assigned and s.datatype.startswith("FP") and s.shape[-1:] == (classes,)
        ]
        if not fitting:
            raise ValueError(
                f"{where}: labels {config.labels} names {classes} classes, and no float output "
                f"has {classes} entries in its last dimension (outputs: "
                + ", ".join(f"{s.name} {s.datatype} {list(s.shape)}" for s in outputs)
                + "); give the output its own `labels`"
            )
        assigned.update(dict.fromkeys(fitting, config.labels))
    return assigned


def config(
    name: str,
    served: ModelConfig,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    labels: Mapping[str, str],
) -> pb.ModelConfig:
    """What the model reports; `inputs`/`outputs` as it serves them, `labels` its outputs'
    label files (assign_labels)."""
    message = pb.ModelConfig()
    if served._triton is not None:
        message.CopyFrom(served._triton)
    else:
        _render(message, served, inputs, outputs, labels)
    message.name = name
    message.platform = message.platform or PLATFORM
    message.backend = message.backend or BACKEND
    batch = served.max_batch_size
    listed = {t.name for t in message.input}
    message.input.extend(triton.model_input(s, batch) for s in inputs if s.name not in listed)
    listed = {t.name for t in message.output}
    message.output.extend(triton.model_output(s, batch) for s in outputs if s.name not in listed)
    if not message.instance_group:
        message.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=served.instance_count)
    return message


def _render(
    message: pb.ModelConfig,
    served: ModelConfig,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    labels: Mapping[str, str],
) -> None:
    """config.yaml's honoured fields, as Triton's."""
    batch = message.max_batch_size = served.max_batch_size
    reshapes = {t.name: t.reshape for t in [*served.inputs, *served.outputs] if t.reshape}
    for spec in inputs:
        message.input.append(_reshaped(triton.model_input(spec, batch), reshapes.get(spec.name)))
    for spec in outputs:
        entry = _reshaped(triton.model_output(spec, batch), reshapes.get(spec.name))
        entry.label_filename = labels.get(spec.name, "")
        message.output.append(entry)
    policy = served.version_policy
    if policy.all:
        message.version_policy.all.SetInParent()
    elif policy.specific is not None:
        message.version_policy.specific.versions.extend(policy.specific)
    else:
        message.version_policy.latest.num_versions = policy.latest or 1
    message.instance_group.add(kind=pb.ModelInstanceGroup.KIND_CPU, count=served.instance_count)
    batching = served.dynamic_batching
    if batching is not None:
        message.dynamic_batching.max_queue_delay_microseconds = round(
            batching.max_queue_delay_ms * 1000
        )
        message.dynamic_batching.preferred_batch_size.extend(batching.preferred_batch_size)
        message.dynamic_batching.default_queue_policy.max_queue_size = served.max_queue_size
    if served.warmup:
        sample = message.model_warmup.add(name="warmup", batch_size=1)
        for input_name, shape in served.warmup.items():
            data = sample.inputs[input_name]
            data.data_type = next(
                (triton.model_input(s, 0).data_type for s in inputs if s.name == input_name),
                pb.TYPE_INVALID,
            )
            if batch:
                sample.batch_size = shape[0]
            data.dims.extend(shape[1:] if batch else shape)
            if input_name in served.warmup_random:
                data.random_data = True
            else:
                data.zero_data = True


def _reshaped(entry: pb.ModelInput | pb.ModelOutput, reshape: list[int] | None):
    if reshape is not None:
        entry.ClearField("reshape")
        entry.reshape.shape.extend(reshape)
        entry.reshape.SetInParent()
    return entry
