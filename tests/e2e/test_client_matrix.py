"""Triton's and KServe's own clients, against every door that serves a model: the proxy's v2
REST door, its gRPC door, and the service itself. Metadata, configuration, statistics, the
repository index, classification and inference answer the same everywhere: one data plane
behind every door (v2server/dataplane.py, proxy/doors/v2plane.py)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.conftest import Mesh
from tests.e2e.test_digits import held_out, png
from tests.procs import ROOT

PROBE = Path(__file__).with_name("client_matrix_probe.py")
KSERVE_PYTHON = ROOT / ".venv-kserve" / "bin" / "python"
COMMON = ("ready", "outputs", "version", "classified")
"""What every client can ask; tritonclient asks metadata, config, statistics, index too."""
TRITON_ONLY = ("metadata", "config", "index")


def probe(client: str, url: str, model: str, request: dict) -> dict:
    python = str(KSERVE_PYTHON) if client.startswith("kserve") else sys.executable
    if client.startswith("kserve") and not KSERVE_PYTHON.exists():
        pytest.fail(f"{KSERVE_PYTHON} missing: ./mesh test creates it")
    done = subprocess.run(
        [python, str(PROBE), client, url, model, json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, f"{client} {url} {model}: {done.stderr[-3000:]}"
    return json.loads(done.stdout)


def doors(mesh: Mesh, service: str | None) -> dict[str, tuple[str, str]]:
    """Client-at-door name -> (client, url)."""
    rest = mesh.url.removeprefix("http://")
    found = {
        "tritonclient.http at the REST door": ("triton-http", rest),
        "kserve REST at the REST door": ("kserve-rest", mesh.url),
        "tritonclient.grpc at the gRPC door": ("triton-grpc", mesh.grpc_address),
        "kserve gRPC at the gRPC door": ("kserve-grpc", mesh.grpc_address),
    }
    if service is not None:
        found["tritonclient.grpc at the service"] = ("triton-grpc", service)
        found["kserve gRPC at the service"] = ("kserve-grpc", service)
    return found


def ask_everywhere(mesh: Mesh, model: str, service: str | None, request: dict) -> dict[str, dict]:
    where = doors(mesh, service)
    with ThreadPoolExecutor(4) as pool:
        answers = pool.map(lambda c: probe(*c, model, request), where.values())
        return dict(zip(where, answers, strict=True))


def assert_same(seen: dict[str, dict]) -> None:
    first_name, first = next(iter(seen.items()))
    for name, answer in seen.items():
        for key in COMMON:
            if answer[key] is not None:  # None: the client cannot tell (probe says why)
                assert answer[key] == first[key], f"{key}: {name} != {first_name}"
    triton = {n: a for n, a in seen.items() if n.startswith("tritonclient")}
    first_name, first = next(iter(triton.items()))
    for name, answer in triton.items():
        assert answer["compressed"] == answer["outputs"], f"gzipped request: {name}"
        for key in TRITON_ONLY:
            assert answer[key] == first[key], f"{key}: {name} != {first_name}"


def test_a_model_a_pipeline_calls_answers_the_same_at_every_door(mesh: Mesh) -> None:
    images, _ = held_out()
    features = images[:2].reshape(2, 64).astype(float).tolist()
    request = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 64], "data": features}],
        "classify": "probabilities",
        "k": 3,
    }
    service = mesh.local.services["proxy"].env["PREDICTOR_DIGITS_MLP_URL"]
    seen = ask_everywhere(mesh, "digits_mlp", service, request)
    assert_same(seen)
    answer = seen["tritonclient.http at the REST door"]
    assert answer["ready"] and answer["version"] == "1"
    assert answer["metadata"]["name"] == "digits_mlp"
    assert answer["config"]["max_batch_size"] == 64
    assert answer["config"]["inputs"] == [["input", [64]]]
    assert answer["index"] == [["digits_mlp", "READY"]]
    assert "digits_mlp" in answer["stats"]["names"] and answer["stats"]["succeeded"] > 0
    # Top 3 of each row, with the model's labels: "score:index:label".
    top = answer["classified"]
    assert len(top) == 6 and all(len(t.split(":")) == 3 for t in top)
    label = answer["outputs"]["label"]
    assert [int(t.split(":")[1]) for t in top[::3]] == label


def test_a_pipeline_answers_the_same_at_both_doors(mesh: Mesh) -> None:
    images, _ = held_out()
    blob = base64.b64encode(png(images[3])).decode()
    request = {
        "inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": [blob]}],
        "classify": "probabilities",
        "k": 2,
    }
    seen = ask_everywhere(mesh, "digits", None, request)
    assert_same(seen)
    answer = seen["tritonclient.http at the REST door"]
    assert answer["version"] == "1" and answer["config"]["name"] == "digits"
    assert answer["metadata"]["inputs"] == [["image", "BYTES", [1]]]
    assert answer["index"] == [["digits", "READY"]]
    # A pipeline has no labels: "score:index", the best first.
    best, second = answer["classified"]
    assert int(best.split(":")[1]) == answer["outputs"]["label"][0]
    assert float(best.split(":")[0]) >= float(second.split(":")[0])
