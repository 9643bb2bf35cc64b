"""A Triton model repository's `config.pbtxt`, read into the predictor's ModelConfig.

The file is parsed as protobuf text into the subset of Triton's ModelConfig this server
honours (protos/grpc_predict_v2.proto: same names and numbers as Triton's). A field outside
that subset fails the parse, and a value inside it that the predictor cannot honour (a GPU
instance group, a queue timeout, ...) fails the conversion: either way start-up stops with
the file, the field and the reason, never silently running something else.
"""

from __future__ import annotations

import re
from pathlib import Path

from google.protobuf import text_format

from predictors.config import (
    ConfigError,
    DynamicBatching,
    ModelConfig,
    ModelTensor,
    VersionPolicy,
)
from protos import pb
from protos.codec import CONFIG_DATA_TYPE

DATATYPES = {value: name for name, value in CONFIG_DATA_TYPE.items()}
PLATFORMS = {"", "onnxruntime_onnx"}
BACKENDS = {"", "onnxruntime"}
_NO_FIELD = re.compile(r'has no field named "(?P<field>[^"]+)"')


def read(path: Path) -> ModelConfig:
    """`path`'s configuration; ConfigError naming the file, the field and why."""
    try:
        message = text_format.Parse(path.read_text(), pb.ModelConfig())
    except text_format.ParseError as exc:
        unknown = _NO_FIELD.search(str(exc))
        if unknown:
            raise ConfigError(
                f"{path}: field '{unknown['field']}' is not supported by this server "
                f"({exc}); remove it or serve the model with Triton"
            ) from None
        raise ConfigError(f"{path}: {exc}") from None
    try:
        config = convert(message)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    config._triton = message
    return config


def convert(config: pb.ModelConfig) -> ModelConfig:
    """Triton's fields as the predictor's; ValueError naming a value it cannot honour."""
    if config.parameters:  # Triton's backends read them; this server would ignore them
        raise ValueError(
            f"field 'parameters' ({', '.join(sorted(config.parameters))}) is not supported "
            "by this server; remove it or serve the model with Triton"
        )
    if config.platform not in PLATFORMS or config.backend not in BACKENDS:
        raise ValueError(
            f"platform '{config.platform}' / backend '{config.backend}': this server runs "
            "ONNX models only (platform onnxruntime_onnx or backend onnxruntime)"
        )
    batch = config.max_batch_size
    return ModelConfig(
        name=config.name or None,
        max_batch_size=batch,
        inputs=[_input(t, batch) for t in config.input],
        outputs=[_output(t, batch) for t in config.output],
        version_policy=_versions(config),
        instance_count=_instances(config),
        **_batching(config),
        **_warmup(config),
    )


def _shape(dims: list[int], batch: int) -> list[int]:
    return [-1, *dims] if batch else list(dims)


def _datatype(value: int, where: str) -> str:
    try:
        return DATATYPES[value]
    except KeyError:
        raise ValueError(f"{where}: data_type {pb.DataType.Name(value)} is not supported") from None


def _input(tensor: pb.ModelInput, batch: int) -> ModelTensor:
    where = f"input '{tensor.name}'"
    if tensor.format != pb.ModelInput.FORMAT_NONE and len(tensor.dims) != 3:
        raise ValueError(f"{where}: format {pb.ModelInput.Format.Name(tensor.format)} needs 3 dims")
    return ModelTensor(
        name=tensor.name,
        datatype=_datatype(tensor.data_type, where),
        shape=_shape(list(tensor.dims), batch),
        optional=tensor.optional,
        reshape=list(tensor.reshape.shape) if tensor.HasField("reshape") else None,
    )


def _output(tensor: pb.ModelOutput, batch: int) -> ModelTensor:
    where = f"output '{tensor.name}'"
    return ModelTensor(
        name=tensor.name,
        datatype=_datatype(tensor.data_type, where),
        shape=_shape(list(tensor.dims), batch),
        reshape=list(tensor.reshape.shape) if tensor.HasField("reshape") else None,
        labels=tensor.label_filename or None,
    )


def _versions(config: pb.ModelConfig) -> VersionPolicy:
    choice = config.version_policy.WhichOneof("policy_choice")
    if choice == "all":
        return VersionPolicy(all=True)
    if choice == "specific":
        return VersionPolicy(specific=list(config.version_policy.specific.versions))
    latest = config.version_policy.latest.num_versions if choice == "latest" else 1
    return VersionPolicy(latest=max(latest, 1))


def _instances(config: pb.ModelConfig) -> int:
    count = 0
    for i, group in enumerate(config.instance_group):
        if group.kind == pb.ModelInstanceGroup.KIND_GPU:
            raise ValueError(
                f"instance_group[{i}] ({group.name or 'unnamed'}): KIND_GPU, and this server "
                "runs on the CPU (use KIND_CPU or KIND_AUTO)"
            )
        count += group.count or 1
    return count or 1


def _batching(config: pb.ModelConfig) -> dict:
    if not config.HasField("dynamic_batching"):
        return {}
    batching = config.dynamic_batching
    queue = batching.default_queue_policy
    if queue.timeout_action == pb.ModelQueuePolicy.DELAY:
        raise ValueError(
            "dynamic_batching.default_queue_policy.timeout_action DELAY is not supported"
        )
    if queue.default_timeout_microseconds:
        raise ValueError(
            "dynamic_batching.default_queue_policy.default_timeout_microseconds is not "
            "supported: every request carries its own deadline (gRPC's, or the `timeout` "
            "parameter), which covers its time in the queue"
        )
    preferred = list(batching.preferred_batch_size)
    too_big = [p for p in preferred if not 0 < p <= config.max_batch_size]
    if too_big:
        raise ValueError(
            f"dynamic_batching.preferred_batch_size {too_big} must lie in 1..max_batch_size "
            f"({config.max_batch_size})"
        )
    out: dict = {
        "dynamic_batching": DynamicBatching(
            max_queue_delay_ms=batching.max_queue_delay_microseconds / 1000,
            preferred_batch_size=preferred,
        )
    }
    if queue.max_queue_size:
        out["max_queue_size"] = queue.max_queue_size
    return out


def _warmup(config: pb.ModelConfig) -> dict:
    if not config.model_warmup:
        return {}
    if len(config.model_warmup) > 1:
        raise ValueError(f"{len(config.model_warmup)} model_warmup samples: this server runs one")
    sample = config.model_warmup[0]
    batch = sample.batch_size or 1
    if not config.max_batch_size and batch != 1:
        raise ValueError("model_warmup.batch_size must be 1 for a model without batching")
    shapes, random = {}, set()
    for name, spec in sample.inputs.items():
        shapes[name] = [batch, *spec.dims] if config.max_batch_size else list(spec.dims)
        if spec.WhichOneof("input_data_type") == "random_data":
            random.add(name)
    return {"warmup": shapes, "warmup_random": sorted(random)}
