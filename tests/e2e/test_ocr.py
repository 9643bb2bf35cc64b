"""The OCR chain through the proxy's REST API, every service a real process."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from rapidocr_onnxruntime import RapidOCR

from bench.inprocess import InProcess
from tests.e2e.conftest import Mesh
from tests.images import cer, encode, text_samples
from tests.report import report

SAMPLES = 24


@pytest.fixture(scope="module")
def samples() -> list[tuple[bytes, list[str]]]:
    return text_samples(SAMPLES, seed=0)


def read(mesh: Mesh, blob: bytes) -> dict:
    with mesh.client() as client:
        r = client.post("/v1/pipelines/ocr/infer", files={"file": ("page.png", blob)})
    assert r.status_code == 200, r.text
    return r.json()["result"]


def test_text_images_read_as_well_as_the_reference(mesh: Mesh, samples) -> None:
    local = InProcess()
    reference = RapidOCR()
    errors = ref_errors = chars = 0
    for blob, truth in samples:
        lines = read(mesh, blob)["lines"]
        ours = [line["text"] for line in lines]
        assert ours == [line["text"] for line in local.ocr(blob)["lines"]], truth
        for line in lines:
            box = np.array(line["box"])
            assert box.shape == (4, 2) and 0 <= line["score"] <= 1
        img = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR)
        theirs = [r[1] for r in (reference(img)[0] or [])]
        e, n = cer(ours, truth)
        re_, _ = cer(theirs, truth)
        errors, ref_errors, chars = errors + e, ref_errors + re_, chars + n
    report(
        f"\nOCR through the mesh on {SAMPLES} images: CER {errors / chars:.4f}, "
        f"reference pipeline {ref_errors / chars:.4f}"
    )
    assert errors / chars <= 0.05
    assert errors <= ref_errors


def test_boxes_are_in_original_pixels(mesh: Mesh) -> None:
    img = np.full((300, 900, 3), 255, np.uint8)
    cv2.putText(img, "Boxes 123", (400, 200), cv2.FONT_HERSHEY_DUPLEX, 1.5, (0, 0, 0), 3)
    (w, h), base = cv2.getTextSize("Boxes 123", cv2.FONT_HERSHEY_DUPLEX, 1.5, 3)
    lines = read(mesh, encode(img))["lines"]
    assert [line["text"] for line in lines] == ["Boxes 123"]
    box = np.array(lines[0]["box"])
    assert abs(box[:, 0].min() - 400) < 12 and abs(box[:, 0].max() - (400 + w)) < 12
    assert abs(box[:, 1].min() - (200 - h)) < 12 and abs(box[:, 1].max() - (200 + base)) < 12


def test_no_text_gives_no_lines(mesh: Mesh) -> None:
    blank = np.full((240, 320, 3), 255, np.uint8)
    assert read(mesh, encode(blank)) == {"lines": []}
