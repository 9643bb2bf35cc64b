"""Whole pipelines called as v2 models by Triton's own clients (gRPC, HTTP, streaming) and
load generator, through the proxy of the shipped mesh: the same answers as /v1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.http as triton_http

from bench import perf_analyzer
from protos import pb, pb_grpc
from samples.digits import suite as digit_suite
from samples.images import encode
from samples.text import suite as text_suite
from tests.e2e.conftest import Mesh
from tests.e2e.test_digits import classify, held_out

PER_CATEGORY = 1
PROBE = Path(__file__).with_name("grpc_door_probe.py")


def probe(address: str, pipeline: str, images: list[bytes], tmp_path: Path) -> dict:
    """What tritonclient's gRPC client gets for each image, unary and streamed (in its own
    process: see the probe's docstring)."""
    files = []
    for i, blob in enumerate(images):
        files.append(tmp_path / f"{pipeline}-{i}.img")
        files[-1].write_bytes(blob)
    run = subprocess.run(
        [sys.executable, str(PROBE), address, pipeline, *map(str, files)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def digit_images() -> list[bytes]:
    images, labels = held_out()
    return [s.image for s in digit_suite(images, labels, PER_CATEGORY, seed=7)]


def _over_http(mesh: Mesh, pipeline: str, blob: bytes) -> triton_http.InferResult:
    # (infer's own `timeout` is Triton's request parameter, in microseconds.)
    client = triton_http.InferenceServerClient(mesh.url.removeprefix("http://"), network_timeout=60)
    tensor = triton_http.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([blob], dtype=object))
    return client.infer(pipeline, [tensor])


def test_digits_over_grpc_http_and_streams_as_on_v1(
    mesh: Mesh, digit_images: list[bytes], tmp_path: Path
) -> None:
    """Every kind of user image (margins, polarity, colour, noise, JPEG...): tritonclient's
    answers are /v1's, over gRPC (unary and one stream) and HTTP (binary tensors)."""
    seen = probe(mesh.grpc_address, "digits", digit_images, tmp_path)
    assert seen["ready"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in seen["metadata"]["outputs"]] == [
        ("label", "INT64", ["1"]),
        ("probabilities", "FP32", ["1", "10"]),
    ]
    for i, blob in enumerate(digit_images):
        v1 = classify(mesh, "digits", blob)
        assert v1["status"] == 200, v1
        label, probabilities = v1["result"]["label"], v1["result"]["probabilities"]
        http = _over_http(mesh, "digits", blob)
        for got in (seen["unary"][i], seen["stream"][str(i)]):
            assert got["label"] == {"shape": [1], "data": [label]}
            np.testing.assert_allclose(got["probabilities"]["data"], [probabilities], atol=1e-6)
        assert http.as_numpy("label").tolist() == [label]
        np.testing.assert_allclose(http.as_numpy("probabilities"), [probabilities], atol=1e-6)


def test_ocr_over_grpc_and_http_as_on_v1(mesh: Mesh, tmp_path: Path) -> None:
    """A text line, and a blank image (no text: empty outputs, not missing ones)."""
    line = text_suite(1, seed=3, categories=["line_medium"])[0].image
    blank = encode(np.full((120, 400, 3), 255, np.uint8))
    seen = probe(mesh.grpc_address, "ocr", [line, blank], tmp_path)
    with mesh.client() as client:
        r = client.post("/v1/pipelines/ocr/infer", files={"file": ("line.png", line)})
    assert r.status_code == 200, r.text
    lines = r.json()["result"]["lines"]
    assert lines, "the line image reads as text"
    http = _over_http(mesh, "ocr", line)
    got = seen["unary"][0]
    assert got["text"]["data"] == [x["text"] for x in lines]
    assert [t.decode() for t in http.as_numpy("text")] == [x["text"] for x in lines]
    for boxes in (np.reshape(got["box"]["data"], got["box"]["shape"]), http.as_numpy("box")):
        np.testing.assert_allclose(boxes, [x["box"] for x in lines])
    np.testing.assert_allclose(got["score"]["data"], [x["score"] for x in lines], rtol=1e-6)
    # The words, a row each, with the row of their line: /v1's words under their lines.
    words = [(w["text"], w["box"], row) for row, x in enumerate(lines) for w in x["words"]]
    assert len(words) >= 2 and got["word"]["data"] == [w for w, _, _ in words]
    assert [t.decode() for t in http.as_numpy("word")] == [w for w, _, _ in words]
    assert got["word_line"]["data"] == http.as_numpy("word_line").tolist() == [r for *_, r in words]
    for boxes in (
        np.reshape(got["word_box"]["data"], got["word_box"]["shape"]),
        http.as_numpy("word_box"),
    ):
        np.testing.assert_allclose(boxes, [b for _, b, _ in words])
    empty = seen["unary"][1]
    assert empty["text"]["shape"] == [0] and empty["box"]["shape"] == [0, 4, 2]
    assert empty["word"]["shape"] == [0] and empty["word_box"]["shape"] == [0, 4, 2]


def test_a_bad_image_is_invalid_argument_naming_it(mesh: Mesh, tmp_path: Path) -> None:
    seen = probe(mesh.grpc_address, "digits", [b"not an image"], tmp_path)
    error = seen["unary"][0]["error"]
    assert error["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "png" in error["message"].lower()


@pytest.mark.parametrize("how", ["grpc", "grpc-streaming", "http"])
def test_perf_analyzer_loads_a_pipeline(mesh: Mesh, digit_images: list[bytes], how: str) -> None:
    """perf_analyzer at either door (over HTTP it reads the model's config and statistics
    from the REST door: once a 404 that stopped it)."""
    streaming = how == "grpc-streaming"
    address = mesh.url.removeprefix("http://") if how == "http" else mesh.grpc_address
    try:
        env = perf_analyzer.environment()
    except perf_analyzer.Unavailable as exc:
        pytest.skip(str(exc))
    with grpc.insecure_channel(mesh.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        def counts() -> tuple[int, int]:
            reply = stub.ModelStatistics(pb.ModelStatisticsRequest(name="digits"), timeout=10)
            stats = reply.model_stats[0].inference_stats
            return stats.success.count, stats.fail.count

        ok_before, failed_before = counts()
        stats = perf_analyzer.measure(
            address,
            "digits",
            4,
            1.5,
            streaming=streaming,
            protocol="http" if how == "http" else "grpc",
            input_data={"image": digit_images[:4]},
            env=env,
        )
        ok, failed = counts()
    assert stats.rps > 0 and stats.p50_ms > 0
    assert ok - ok_before >= stats.requests > 0
    assert failed == failed_before
