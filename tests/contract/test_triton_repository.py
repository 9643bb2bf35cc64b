"""A Triton model repository served unchanged: config.pbtxt read field by field (what the
predictor cannot honour refused at start-up, by name), Triton's flag names accepted, and
every field it honours visible in what the server does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import text_format

from protos import messages, pb, pb_grpc
from tests.modelgen import (
    DENSENET_STYLE_PBTXT,
    LINEAR_PBTXT,
    SIMPLE_PBTXT,
    build_triton_repository,
    linear_weights,
)
from tests.procs import ROOT, Service


@pytest.fixture(scope="module")
def stub(triton_predictor: Service):
    with grpc.insecure_channel(triton_predictor.address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@pytest.mark.parametrize(
    ("model", "pbtxt"),
    [
        ("linear_triton", LINEAR_PBTXT),
        ("channel_means", DENSENET_STYLE_PBTXT),
        ("simple", SIMPLE_PBTXT),
    ],
)
def test_the_reported_config_is_config_pbtxt_round_trip(stub, model: str, pbtxt: str) -> None:
    """Every field the file sets comes back as written (the format, reshapes, label files,
    the version policy, the warm-up, the queue bound, each preferred batch size)."""
    written = text_format.Parse(pbtxt, pb.ModelConfig())
    reported = stub.ModelConfig(pb.ModelConfigRequest(name=model), timeout=10).config
    for field, value in written.ListFields():
        assert getattr(reported, field.name) == value, field.name
    # What Triton's auto-complete adds beside: both names of the runtime.
    assert (reported.platform, reported.backend) == ("onnxruntime_onnx", "onnxruntime")


def test_labels_belong_to_the_output_that_declares_them(stub) -> None:
    """`label_filename` on OUTPUT0 only: OUTPUT1 classified has no label names."""
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    request = messages.build_request("simple", {"INPUT0": a, "INPUT1": np.ones_like(a)})
    for name in ("OUTPUT0", "OUTPUT1"):
        request.outputs.add(name=name).parameters["classification"].int64_param = 1
    outputs = messages.response_outputs(stub.ModelInfer(request, timeout=10))
    assert outputs["OUTPUT0"][0, 0].decode() == "16.000000:15:label15"
    assert outputs["OUTPUT1"][0, 0].decode() == "14.000000:15"


def test_the_config_is_what_config_pbtxt_says(stub) -> None:
    config = stub.ModelConfig(pb.ModelConfigRequest(name="linear_triton"), timeout=10).config
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="linear_triton"), timeout=10)
    assert (config.platform, config.max_batch_size) == ("onnxruntime_onnx", 8)
    assert [(t.name, list(t.dims)) for t in config.input] == [("x", [4])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("y", [3]), ("label", [])]
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config.instance_group[0].count == 2
    assert list(meta.versions) == ["2"]  # version_policy: latest 1 of 1 and 2


def test_the_model_answers_with_its_labels(stub) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    request = messages.build_request("linear_triton", {"x": x})
    request.outputs.add(name="y").parameters["classification"].int64_param = 1
    request.outputs.add(name="label")
    outputs = messages.response_outputs(stub.ModelInfer(request, timeout=10))
    w, b = linear_weights(2)
    expected = (x @ w + b).argmax(axis=1)
    names = ["cat", "dog", "emu"]
    assert outputs["label"].tolist() == expected.tolist()
    assert [v.decode().split(":")[2] for v in outputs["y"][:, 0]] == [names[i] for i in expected]


def test_reshape_as_in_tritons_densenet_example(stub) -> None:
    """Callers send [3, 4, 4] and get [3]; the graph takes [1, 3, 4, 4], gives [1, 3, 1, 1]."""
    image = np.random.default_rng(0).random((3, 4, 4), dtype=np.float32)
    request = messages.build_request("channel_means", {"data_0": image})
    outputs = messages.response_outputs(stub.ModelInfer(request, timeout=10))
    np.testing.assert_allclose(outputs["fc6_1"], image.mean(axis=(1, 2)), rtol=1e-6)
    wrong = messages.build_request("channel_means", {"data_0": image[:2]})
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(wrong, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (("max_batch_size: 8\n", "max_batch_size: 8\noptimization { }\n"), "'optimization'"),
        (
            ("max_batch_size: 8\n", 'max_batch_size: 8\nparameters { key: "k" value { } }\n'),
            "'parameters' (k)",
        ),
        (("kind: KIND_CPU", "kind: KIND_GPU"), "KIND_GPU"),
        (("max_queue_size: 64", "default_timeout_microseconds: 1000"), "default_timeout"),
        (('platform: "onnxruntime_onnx"', 'platform: "tensorflow_savedmodel"'), "ONNX models"),
        (("count: 2\n", "count: 2\n    gpus: [ 0 ]\n"), "'gpus'"),
        (("[ 4, 8 ]", "[ 4, 16 ]"), "preferred_batch_size [16]"),
        (
            ("data_type: TYPE_FP32\n    dims: [ 4 ]", "data_type: TYPE_INT64\n    dims: [ 4 ]"),
            "input 'x': data_type INT64 in the config, the graph's is FP32",
        ),
        (("dims: [ 4 ]", "dims: [ 5 ]"), "input 'x': dims [-1, 5] in the config"),
        (('name: "y"', 'name: "why"'), "config output ['why'] not in the graph"),
    ],
)
def test_what_cannot_be_honoured_stops_start_up_by_name(
    tmp_path: Path, change: tuple[str, str], named: str
) -> None:
    root = build_triton_repository(tmp_path / "repository")
    old, new = change
    assert old in LINEAR_PBTXT
    (root / "linear_triton" / "config.pbtxt").write_text(LINEAR_PBTXT.replace(old, new))
    run = subprocess.run(
        [sys.executable, "-m", "predictors", "--model-repository", str(root), "--grpc-port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "config.pbtxt" in run.stderr and named in run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize("module", ["predictors", "preprocess", "proxy"])
def test_every_command_describes_its_flags_and_variables(module: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True
    )
    prefix = {"predictors": "PREDICTOR", "preprocess": "PREPROCESS", "proxy": "PROXY"}[module]
    text = " ".join(run.stdout.split())  # argparse wraps lines
    assert run.returncode == 0, run.stderr
    assert f"[env {prefix}_PORT]" in text and "--log-level" in text
    assert "JSON lines on stderr" in text  # the field's own description
