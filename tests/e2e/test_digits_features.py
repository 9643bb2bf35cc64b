"""A pipeline over tensors, not an upload: `digits-features` takes the 64 features of each
digit (as the seed's design did) on /v1 as JSON or multipart, and as a v2 FP32 [N, 64] tensor
at both v2 doors; every way answers what the same ensemble answers in one process."""

from __future__ import annotations

import json

import grpc
import numpy as np
import tritonclient.http as triton_http

from bench.inprocess import InProcess
from protos import messages, pb_grpc
from tests.e2e.conftest import Mesh
from tests.e2e.test_digits import held_out

PATH = "/v1/pipelines/digits-features/infer"


def test_rows_of_features_read_right_every_way(mesh: Mesh) -> None:
    images, targets = held_out()
    x = images[:120].reshape(-1, 64).astype(np.float32)
    expected = InProcess().digits_features(x)
    with mesh.client() as client:
        answers = [
            client.post(PATH, json={"features": x[i : i + 40].tolist()}) for i in (0, 40, 80)
        ]
        form = client.post(PATH, files={"features": (None, json.dumps(x[:5].tolist()))})
    for answer in [*answers, form]:
        assert answer.status_code == 200, answer.text
    labels = [p["label"] for a in answers for p in a.json()["result"]["predictions"]]
    assert labels == expected["label"]
    assert np.mean(np.array(labels) == targets[:120]) >= 0.95
    first = answers[0].json()["result"]["predictions"][0]["probabilities"]
    np.testing.assert_allclose(first, expected["probabilities"][0], atol=1e-5)
    assert [p["label"] for p in form.json()["result"]["predictions"]] == labels[:5]

    rest = triton_http.InferenceServerClient(mesh.url.removeprefix("http://"))
    tensor = triton_http.InferInput("features", list(x[:40].shape), "FP32")
    tensor.set_data_from_numpy(x[:40])
    over_rest = rest.infer("digits-features", [tensor]).as_numpy("label")
    with grpc.insecure_channel(mesh.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = messages.build_request("digits-features", {"features": x[:40]})
        over_grpc = messages.response_outputs(stub.ModelInfer(request, timeout=30))["label"]
    assert over_rest.tolist() == over_grpc.tolist() == labels[:40]


def test_bad_feature_bodies_are_named(mesh: Mesh) -> None:
    cases = {
        "no input named pixels": {"pixels": [[0] * 64]},
        "missing input features": {},
        "ragged": {"features": [[0] * 64, [0] * 3]},
        "FP32 elements must be JSON numbers": {"features": [["a"] * 64]},
        # Not infinity, which the models would turn into NaN, refused as the mesh's fault.
        "an element is out of FP32's range": {"features": [[1e39] + [0] * 63]},
        "expected shape [-1, 64], got [1, 63]": {"features": [[0] * 63]},
        # 0..255 pixels for scikit-learn's 0..16 features: ten confident wrong answers before.
        "within [0, 16]; element [1, 3] is 255": {"features": [[0] * 64, [16] * 3 + [255] * 61]},
        "within [0, 16]; element [0, 0] is -1": {"features": [[-1] + [0] * 63]},
    }
    with mesh.client() as client:
        for complaint, body in cases.items():
            answer = client.post(PATH, json=body)
            assert answer.status_code == 400 and complaint in answer.json()["error"], answer.text
        image = client.post(PATH, content=b"\x89PNG", headers={"Content-Type": "image/png"})
        # 200,000 names the pipeline does not take: named, but not all 1.8 MB of them.
        flood = client.post(PATH, json={f"n{i:06d}": [1] for i in range(200_000)})
    assert image.status_code == 415 and "takes tensors (features)" in image.json()["error"]
    error = flood.json()["error"]
    assert flood.status_code == 400 and error.startswith("no input named n000000, n000001")
    assert len(error) < 1100 and error.endswith("more characters)")


def test_features_outside_their_bounds_are_the_clients_error_at_every_door(mesh: Mesh) -> None:
    """NaN or 0..255 values sent as FP32 at the v2 doors: a 400 (INVALID_ARGUMENT) naming the
    element, not a 502 blaming the mesh for the NaN the models made of them, nor an answer."""
    nan = np.zeros((2, 64), np.float32)
    nan[1, 5] = np.nan
    pixels = np.full((1, 64), 255.0, np.float32)
    rest = triton_http.InferenceServerClient(mesh.url.removeprefix("http://"))
    with grpc.insecure_channel(mesh.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for x, element in ((nan, "element [1, 5] is nan"), (pixels, "element [0, 0] is 255")):
            request = messages.build_request("digits-features", {"features": x})
            try:
                stub.ModelInfer(request, timeout=30)
                raise AssertionError("answered")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
                assert element in exc.details(), exc.details()
            tensor = triton_http.InferInput("features", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            try:
                rest.infer("digits-features", [tensor])
                raise AssertionError("answered")
            except triton_http.InferenceServerException as exc:
                assert exc.status() == "400" and element in exc.message(), exc
