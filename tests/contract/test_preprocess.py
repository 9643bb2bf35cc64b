"""The preprocess service as a process: recipes over gRPC, errors, start-up checks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_digits

from preprocess import recipes as recipe_file
from preprocess.settings import DEFAULT_RECIPES
from protos import messages, pb, pb_grpc
from samples.images import encode, render_digit
from tests.procs import Service, run_module

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def stub(preprocess_service: Service) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(preprocess_service.address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def images(*blobs: bytes) -> np.ndarray:
    out = np.empty(len(blobs), dtype=object)
    out[:] = list(blobs)
    return out


def test_every_recipe_is_listed_with_metadata(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    for name in recipe_file.load(DEFAULT_RECIPES):
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=name), timeout=TIMEOUT)
        assert meta.platform == "opencv_recipe" and meta.inputs and meta.outputs


def test_digits_over_grpc_equals_in_process(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    data = load_digits()
    batch = images(*(encode(render_digit(v)) for v in data.images[:32]))
    response = stub.ModelInfer(
        messages.build_request("digits_input", {"image": batch}), timeout=TIMEOUT
    )
    remote = messages.response_outputs(response)["input"]
    local = recipe_file.load(DEFAULT_RECIPES)["digits_input"].run({"image": batch})["input"]
    np.testing.assert_array_equal(remote, local)


def test_recipe_config_and_statistics(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """Triton's ModelConfig / ModelStatistics work on recipes too (the same server core)."""
    config = stub.ModelConfig(pb.ModelConfigRequest(name="digits_input"), timeout=TIMEOUT).config
    # digits takes one image a row (recipes.yaml says so), so callers may merge requests.
    assert (config.platform, config.max_batch_size) == ("opencv_recipe", 64)
    ocr = stub.ModelConfig(pb.ModelConfigRequest(name="ocr_crops"), timeout=TIMEOUT).config
    assert ocr.max_batch_size == 0
    assert [(i.name, i.data_type) for i in config.input] == [("image", pb.TYPE_STRING)]

    def counts() -> tuple[int, int]:
        reply = stub.ModelStatistics(
            pb.ModelStatisticsRequest(name="digits_input"), timeout=TIMEOUT
        )
        (stats,) = reply.model_stats
        return stats.inference_stats.success.count, stats.execution_count

    before = counts()
    batch = images(encode(render_digit(load_digits().images[0])))
    stub.ModelInfer(messages.build_request("digits_input", {"image": batch}), timeout=TIMEOUT)
    assert counts() == (before[0] + 1, before[1] + 1)


def test_unknown_recipe_is_not_found(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = messages.build_request("sharpen", {"image": images(b"x")})
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=TIMEOUT)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown recipe 'sharpen'" in (info.value.details() or "")


def test_not_an_image_is_invalid_and_named(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = messages.build_request(
        "digits_input", {"image": images(encode(np.zeros((8, 8), np.uint8)), b"GIF89a-nonsense")}
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=TIMEOUT)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'image' element 1 is GIF, not a decodable image" in (info.value.details() or "")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(blob=st.binary(max_size=512))
def test_random_uploads_get_a_clean_answer(
    stub: pb_grpc.GRPCInferenceServiceStub, blob: bytes
) -> None:
    request = messages.build_request("digits_input", {"image": images(blob)})
    try:
        stub.ModelInfer(request, timeout=TIMEOUT)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=TIMEOUT).live


@pytest.mark.parametrize(
    ("step", "named"),
    [
        ("{sharpen: {amount: 2}}", "unknown operation 'sharpen'"),
        # A weight misspelt: refused at start, not at the first page read.
        (
            "{ocr_ctc_decode: {characters_file: c.txt, ink_gap_weights: {bais: 1.0}}}",
            "unexpected keyword argument 'bais'",
        ),
    ],
)
def test_bad_recipe_file_fails_start_naming_the_problem(
    tmp_path: Path, step: str, named: str
) -> None:
    bad = tmp_path / "recipes.yaml"
    bad.write_text(
        "recipes:\n  r:\n    inputs: [{name: i, datatype: BYTES, shape: [-1]}]\n"
        "    outputs: [{name: o, datatype: FP32, shape: [-1]}]\n"
        f"    steps: [{step}]\n"
    )
    result = run_module("preprocess", ["--config", str(bad), "--port", "0"])
    assert result.returncode == 2
    assert "recipes.yaml" in result.stderr and named in result.stderr


def test_shared_memory_is_off_unless_asked_for(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    assert "system_shared_memory" not in stub.ServerMetadata(pb.ServerMetadataRequest()).extensions
    with pytest.raises(grpc.RpcError) as refused:
        stub.SystemSharedMemoryRegister(
            pb.SystemSharedMemoryRegisterRequest(name="r", key="/any", byte_size=8)
        )
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "turned off" in refused.value.details()
