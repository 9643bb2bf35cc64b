"""The OCR chain through the proxy's REST API, every service a real process."""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import pytest
from rapidocr_onnxruntime import RapidOCR

from bench.inprocess import InProcess
from samples.images import cer, encode
from samples.text import CATEGORIES, Sample, suite
from tests.e2e.conftest import Mesh
from tests.report import report

PER_CATEGORY = 8


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    return suite(PER_CATEGORY, seed=0)


def read(mesh: Mesh, blob: bytes) -> dict:
    with mesh.client() as client:
        r = client.post("/v1/pipelines/ocr/infer", files={"file": ("page.png", blob)})
    assert r.status_code == 200, r.text
    return r.json()["result"]


def test_text_images_read_at_least_as_well_as_the_reference(
    mesh: Mesh, samples: list[Sample]
) -> None:
    """Every category of the generated suite (line sizes from 10 to 80 px, pages, upside
    down, light on dark, noise, blur, JPEG, perspective, colour, gradients, photos): the
    mesh's character error rate (spaces ignored) is no higher than the reference
    library's (rapidocr-onnxruntime on the same three models) on the same images, and the
    mesh reads exactly what the same steps read in one process."""
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda s: read(mesh, s.image)["lines"], samples))
    # Both in-process readers run on two threads (one ONNX Runtime thread per call each):
    # the same answers, half the wall time of the suite.
    local = InProcess()
    engines = threading.local()

    def theirs(sample: Sample) -> list[str]:
        if not hasattr(engines, "reference"):
            engines.reference = RapidOCR(intra_op_num_threads=1)
        img = cv2.imdecode(np.frombuffer(sample.image, np.uint8), cv2.IMREAD_COLOR)
        return [r[1] for r in (engines.reference(img)[0] or [])]

    with ThreadPoolExecutor(2) as pool:
        expected = list(pool.map(lambda s: local.ocr(s.image)["lines"], samples))
        references = list(pool.map(theirs, samples))
    errors: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # ours, reference, chars
    for sample, lines, mine, their in zip(samples, answers, expected, references, strict=True):
        ours = [line["text"] for line in lines]
        assert ours == [line["text"] for line in mine], sample.lines
        for line in lines:
            assert np.array(line["box"]).shape == (4, 2) and 0 <= line["score"] <= 1
        e, n = cer(ours, sample.lines)
        re_, _ = cer(their, sample.lines)
        tally = errors[sample.category]
        tally[0], tally[1], tally[2] = tally[0] + e, tally[1] + re_, tally[2] + n
    rates = {c: (errors[c][0] / errors[c][2], errors[c][1] / errors[c][2]) for c in CATEGORIES}
    report(
        f"\nOCR character error rate per category, {PER_CATEGORY} images each, "
        "mesh / reference library: "
        + ", ".join(f"{c} {ours:.3f}/{ref:.3f}" for c, (ours, ref) in rates.items())
    )
    worse = {c: r for c, r in rates.items() if r[0] > r[1]}
    assert not worse, f"categories where the mesh reads worse than the reference: {worse}"
    total = sum(e[0] for e in errors.values()) / sum(e[2] for e in errors.values())
    assert total <= 0.01


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
