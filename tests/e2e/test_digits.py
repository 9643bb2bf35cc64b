"""The digits ensemble through the proxy's REST API, every service a real process."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
from sklearn.datasets import load_digits

from bench.inprocess import REPOSITORY, InProcess
from tests.e2e.conftest import Mesh
from tests.images import encode
from tests.report import report


def held_out() -> tuple[np.ndarray, np.ndarray]:
    meta = json.loads((REPOSITORY / "digits_logreg" / "metrics.json").read_text())
    data = load_digits()
    idx = np.array(meta["test_indices"])
    return data.images[idx], data.target[idx]


def png(values: np.ndarray, side: int = 32) -> bytes:
    gray = np.round(255 - values * (255 / 16)).astype(np.uint8)
    return encode(cv2.resize(gray, (side, side), interpolation=cv2.INTER_NEAREST))


def classify(mesh: Mesh, pipeline: str, blob: bytes) -> dict:
    with mesh.client() as client:
        r = client.post(
            f"/v1/pipelines/{pipeline}/infer", content=blob, headers={"Content-Type": "image/png"}
        )
    return {"status": r.status_code, **r.json()}


def test_held_out_split_through_the_mesh(mesh: Mesh) -> None:
    images, targets = held_out()
    blobs = [png(v) for v in images]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: classify(mesh, "digits", b), blobs))
    assert all(a["status"] == 200 for a in answers), [a for a in answers if a["status"] != 200][:3]
    labels = np.array([a["result"]["label"] for a in answers])
    accuracy = (labels == targets).mean()
    local = InProcess()
    expected = np.array([local.digits(b)["label"] for b in blobs])
    agreement = (labels == expected).mean()
    report(
        f"\ndigits through the mesh: {len(blobs)} held-out images, accuracy {accuracy:.4f}, "
        f"agreement with in-process {agreement:.4f}"
    )
    assert accuracy >= 0.95
    assert agreement >= 0.99
    first = answers[0]["result"]
    assert set(first["members"]) == {"logreg", "mlp", "forest"}
    assert abs(sum(first["probabilities"]) - 1) < 1e-3


def test_a_stopped_classifier(mesh: Mesh) -> None:
    images, _ = held_out()
    blob = png(images[0])
    proc = mesh.local.procs["digits-mlp"]
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    try:
        partial = classify(mesh, "digits-partial", blob)
        strict = classify(mesh, "digits", blob)
        with mesh.client() as client:
            ready = client.get("/readyz")
    finally:
        mesh.local.start("digits-mlp")
        mesh.local.wait_healthy("digits-mlp", 60)
    assert partial["status"] == 200 and partial["partial"] is True
    assert set(partial["result"]["members"]) == {"logreg", "forest"}
    failed = [s for s in partial["steps"] if s["name"] == "ensemble/mlp"]
    assert failed and failed[0]["status"] == "unavailable"
    assert strict["status"] == 503 and strict["step"] == "ensemble/mlp"
    assert ready.status_code == 503
    assert ready.json()["endpoints"]["PREDICTOR_DIGITS_MLP_URL/digits_mlp"]["ready"] is False
    # The proxy recovers by itself, within a few seconds of the service being back.
    deadline = time.monotonic() + 5
    while (status := classify(mesh, "digits", blob)["status"]) != 200:
        assert time.monotonic() < deadline, f"still {status} 5 s after the restart"
        time.sleep(0.1)
