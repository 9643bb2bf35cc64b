"""The digits ensemble through the proxy's REST API, every service a real process."""

from __future__ import annotations

import signal
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import pytest

from bench.inprocess import InProcess
from models.digits import load_split
from protos.errors import InvalidInput
from samples.digits import CATEGORIES, blank_images, suite
from samples.images import encode
from tests.e2e.conftest import Mesh
from tests.report import report

PER_CATEGORY = 100


def held_out() -> tuple[np.ndarray, np.ndarray]:
    """The held-out split's 8x8 images and labels (never drawn for training)."""
    split = load_split()
    return split.images[split.test_idx], split.target[split.test_idx]


def photos(count: int, seed: int) -> list[bytes]:
    """`count` held-out digits as users send them: every look of the generated suite in turn
    (margins, colour, noise, JPEG, rotation, phone-photo sizes, ...), PNG or JPEG."""
    images, targets = held_out()
    per_category = -(-count // len(CATEGORIES))
    return [s.image for s in suite(images, targets, per_category, seed=seed)][:count]


def upload_type(blob: bytes) -> str:
    """The Content-Type a client would send with `blob` (a PNG or a JPEG)."""
    return "image/jpeg" if blob[:2] == b"\xff\xd8" else "image/png"


def png(values: np.ndarray, side: int = 32) -> bytes:
    gray = np.round(255 - values * (255 / 16)).astype(np.uint8)
    return encode(cv2.resize(gray, (side, side), interpolation=cv2.INTER_NEAREST))


def classify(mesh: Mesh, pipeline: str, blob: bytes) -> dict:
    with mesh.client() as client:
        r = client.post(
            f"/v1/pipelines/{pipeline}/infer", content=blob, headers={"Content-Type": "image/png"}
        )
    return {"status": r.status_code, **r.json()}


def _in_process(local: InProcess, blob: bytes) -> int | None:
    try:
        return local.digits(blob)["label"]
    except InvalidInput:
        return None


def test_users_digit_images_read_right(mesh: Mesh) -> None:
    """Every category of the generated suite (margins, polarity, paper, noise, blur,
    strokes, JPEG, rotation, sizes up to a phone photo, and all at once), drawn from the
    held-out split: >= 0.95 right in each, the same answers as the steps in one process."""
    images, targets = held_out()
    samples = suite(images, targets, PER_CATEGORY, seed=0)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda s: classify(mesh, "digits", s.image), samples))
    local = InProcess()
    expected = [_in_process(local, s.image) for s in samples]
    right: dict[str, list[bool]] = defaultdict(list)
    agree = 0
    for sample, answer, mine in zip(samples, answers, expected, strict=True):
        label = answer["result"]["label"] if answer["status"] == 200 else None
        right[sample.category].append(label == sample.label)
        agree += label == mine
    accuracy = {name: float(np.mean(right[name])) for name in CATEGORIES}
    agreement = agree / len(samples)
    report(
        f"\ndigits through the mesh, {PER_CATEGORY} held-out images per category: "
        + ", ".join(f"{name} {acc:.2f}" for name, acc in accuracy.items())
        + f"; agreement with in-process {agreement:.4f}"
    )
    refused = [a for a in answers if a["status"] != 200]
    assert not refused, refused[:3]
    assert min(accuracy.values()) >= 0.95, accuracy
    assert agreement >= 0.99
    first = answers[0]["result"]
    assert set(first["members"]) == {"logreg", "mlp", "forest"}
    assert abs(sum(first["probabilities"]) - 1) < 1e-3


@pytest.mark.parametrize("blob", blank_images(6, seed=11))
def test_an_image_without_ink_is_refused(mesh: Mesh, blob: bytes) -> None:
    answer = classify(mesh, "digits", blob)
    assert answer["status"] == 400, answer
    assert answer["step"] == "preprocess" and "has no ink" in answer["error"]


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
