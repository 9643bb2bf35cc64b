"""The committed stubs must be what scripts/gen_protos.py makes from the .proto."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts/gen_protos.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    files = _generator().generate(tmp_path)
    assert files, "protoc produced nothing"
    for fresh in files:
        committed = ROOT / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} missing: run scripts/gen_protos.py"
        assert committed.read_bytes() == fresh.read_bytes(), (
            f"{committed.relative_to(ROOT)} is stale: run python scripts/gen_protos.py"
        )


def test_field_numbers_match_the_published_protocol() -> None:
    """tritonclient and the kserve SDK rely on these exact numbers."""
    from protos import pb

    def numbers(message) -> dict[str, int]:
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    assert numbers(pb.ModelInferRequest) == {
        "model_name": 1,
        "model_version": 2,
        "id": 3,
        "parameters": 4,
        "inputs": 5,
        "outputs": 6,
        "raw_input_contents": 7,
    }
    assert numbers(pb.ModelInferResponse) == {
        "model_name": 1,
        "model_version": 2,
        "id": 3,
        "parameters": 4,
        "outputs": 5,
        "raw_output_contents": 6,
    }
    assert numbers(pb.ModelInferRequest.InferInputTensor) == {
        "name": 1,
        "datatype": 2,
        "shape": 3,
        "parameters": 4,
        "contents": 5,
    }
    assert numbers(pb.InferTensorContents) == {
        "bool_contents": 1,
        "int_contents": 2,
        "int64_contents": 3,
        "uint_contents": 4,
        "uint64_contents": 5,
        "fp32_contents": 6,
        "fp64_contents": 7,
        "bytes_contents": 8,
    }
    assert pb.DESCRIPTOR.package == "inference"
    assert pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name == (
        "inference.GRPCInferenceService"
    )
