"""The OCR chain through the proxy's REST API, every service a real process."""

from __future__ import annotations

import re
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import pytest
from rapidocr_onnxruntime import RapidOCR

from bench.inprocess import InProcess
from samples.images import cer, encode, word_box_fit
from samples.text import CATEGORIES, Sample, receipt, suite
from tests.e2e.conftest import Mesh
from tests.procs import ROOT
from tests.report import report

PER_CATEGORY = 8
REFERENCE_EVERY = 4
"""The reference library reads every fourth image of each category (2 of 8): it takes ~8x the
mesh's time a page (3.1 s against 0.36 s on one thread: it scales a line's shorter side up to
736 px before detecting), and reading half of them took 95 s of the suite's 20 minutes. The
mesh's own error rate is measured on all of them."""
IN_PROCESS_EVERY = 4
"""The same steps in one process read the images the reference reads (2 of 8 a category):
the mesh must read exactly what they read. Reading every other image added ~10 s to the
suite for no other case."""


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    return suite(PER_CATEGORY, seed=0)


@pytest.fixture(scope="module")
def answers(mesh: Mesh, samples: list[Sample]) -> list[list[dict]]:
    """The mesh's lines for each sample."""
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda s: read(mesh, s.image)["lines"], samples))


LONGEST_BUDGET = {"X-Request-Timeout-Ms": "60000"}
"""These tests measure what is read, not budgets: beside the other worker, four pages at once
with `ocr`'s own 15 s were twice refused at the pace's edge ("~15.01 s of work ahead, 15.00 s
left"), the pace reading a page's cost from its pixels alone."""


def read(mesh: Mesh, blob: bytes) -> dict:
    with mesh.client() as client:
        r = client.post(
            "/v1/pipelines/ocr/infer", files={"file": ("page.png", blob)}, headers=LONGEST_BUDGET
        )
    assert r.status_code == 200, r.text
    return r.json()["result"]


def test_text_images_read_at_least_as_well_as_the_reference(
    samples: list[Sample], answers: list[list[dict]]
) -> None:
    """Every category of the generated suite (line sizes from 10 to 80 px, pages, upside
    down, light on dark, noise, blur, JPEG, perspective, colour, gradients, photos): the
    mesh's character error rate is no higher than the reference library's
    (rapidocr-onnxruntime on the same three models) on the same images (the reference reads
    a quarter of them), spaces ignored and counted; counting spaces, a tenth of the reference's
    over those; below 1% over the whole suite, and at most 0.005 counting spaces on every
    category (issue 31); and the mesh reads exactly what the same steps read in one process
    (on a quarter of the images), words and their boxes too."""
    # Both in-process readers run on two threads (one ONNX Runtime thread per call each):
    # the same answers, half the wall time of the suite.
    local = InProcess()
    engines = threading.local()

    def theirs(sample: Sample) -> list[str]:
        if not hasattr(engines, "reference"):
            engines.reference = RapidOCR(intra_op_num_threads=1)
        img = cv2.imdecode(np.frombuffer(sample.image, np.uint8), cv2.IMREAD_COLOR)
        return [r[1] for r in (engines.reference(img)[0] or [])]

    compared = list(range(0, len(samples), REFERENCE_EVERY))
    twins = list(range(0, len(samples), IN_PROCESS_EVERY))
    with ThreadPoolExecutor(2) as pool:
        read_alone = pool.map(lambda i: local.ocr(samples[i].image)["lines"], twins)
        read_by_them = pool.map(theirs, [samples[i] for i in compared])
        expected = dict(zip(twins, read_alone, strict=True))
        references = dict(zip(compared, read_by_them, strict=True))
    # [ours, reference, characters] spaces ignored, then the same counting spaces, over the
    # images the reference read; and ours alone over all of them
    errors: dict[str, list[int]] = defaultdict(lambda: [0] * 6)
    all_errors = all_chars = 0
    spaced: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    """Per category, over all the images: (errors counting spaces, characters)."""
    for i, (sample, lines) in enumerate(zip(samples, answers, strict=True)):
        ours = [line["text"] for line in lines]
        for line in lines:
            assert np.array(line["box"]).shape == (4, 2) and 0 <= line["score"] <= 1
            assert [w["text"] for w in line["words"]] == line["text"].split()
        if i in expected:
            assert ours == [line["text"] for line in expected[i]], sample.lines
            for line, alone in zip(lines, expected[i], strict=True):
                np.testing.assert_allclose(
                    [w["box"] for w in line["words"]] or np.zeros((0, 4, 2)),
                    [w["box"] for w in alone["words"]] or np.zeros((0, 4, 2)),
                    atol=0.01,
                )
        e, n = cer(ours, sample.lines, False)
        all_errors, all_chars = all_errors + e, all_chars + n
        e, n = cer(ours, sample.lines, True)
        spaced[sample.category][0] += e
        spaced[sample.category][1] += n
        if i not in compared:
            continue
        their = references[i]
        tally = errors[sample.category]
        for k, spaces in ((0, False), (3, True)):
            e, n = cer(ours, sample.lines, spaces)
            re_, _ = cer(their, sample.lines, spaces)
            tally[k], tally[k + 1], tally[k + 2] = (
                tally[k] + e,
                tally[k + 1] + re_,
                tally[k + 2] + n,
            )
    rates = {
        c: [errors[c][k] / errors[c][k // 3 * 3 + 2] for k in (0, 1, 3, 4)] for c in CATEGORIES
    }
    totals = [
        sum(e[k] for e in errors.values()) / sum(e[k // 3 * 3 + 2] for e in errors.values())
        for k in (0, 1, 3, 4)
    ]
    every = PER_CATEGORY // REFERENCE_EVERY
    report(
        f"\nOCR character error rate, {every} images a category, mesh / reference library, "
        "spaces ignored | counting spaces: "
        + ", ".join(f"{c} {a:.3f}/{b:.3f} | {x:.3f}/{y:.3f}" for c, (a, b, x, y) in rates.items())
        + ", all {:.4f}/{:.4f} | {:.4f}/{:.4f}".format(*totals)
        + f"; the mesh on all {PER_CATEGORY} a category: {all_errors / all_chars:.4f}, "
        "counting spaces " + ", ".join(f"{c} {e / n:.4f}" for c, (e, n) in spaced.items())
    )
    worse = {c: r[:2] for c, r in rates.items() if r[0] > r[1]}
    assert not worse, f"categories where the mesh reads worse than the reference: {worse}"
    assert all_errors / all_chars <= 0.01
    # Counting spaces: words read as written (issue 31: a tenth of the reference's errors).
    worse = {c: r[2:] for c, r in rates.items() if r[2] > r[3]}
    assert not worse, f"categories where the mesh's spaces are worse than the reference's: {worse}"
    assert totals[2] <= totals[3] / 10, totals
    over = {c: round(e / n, 4) for c, (e, n) in spaced.items() if e / n > 0.005}
    assert not over, f"categories read over 0.005 counting spaces (issue 31): {over}"


def test_word_boxes_cover_the_words_as_drawn(
    samples: list[Sample], answers: list[list[dict]]
) -> None:
    """Every word of every line read right has a box over the word as drawn (across: its
    ink; down: its line's), through perspective, upside-down pages and photos: along the
    line, intersection over union at least 0.6 for every word and 0.93 on average; the
    box covers at least 70% of every word and 90% of 95% of them (measured on seeds 0-2:
    0.64 and 0.75 at the least, docs/accuracy.md)."""
    fits: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for sample, lines in zip(samples, answers, strict=True):
        truth = dict(zip(sample.lines, sample.words, strict=True))
        for line in lines:
            if line["text"] not in truth:
                continue  # a line misread is the character error rate's business
            drawn = truth[line["text"]]
            assert [w for w, _ in drawn] == [w["text"] for w in line["words"]]
            fits[sample.category] += [
                word_box_fit(box, word["box"])
                for (_, box), word in zip(drawn, line["words"], strict=True)
            ]
    every = np.array([f for values in fits.values() for f in values])
    along, cover = every[:, 0], every[:, 1]
    report(
        f"OCR word boxes against the words as drawn ({len(every)} words on lines read "
        f"right): along the line, intersection over union mean {along.mean():.3f}, least "
        f"{along.min():.3f}; share of the word covered mean {cover.mean():.3f}, least "
        f"{cover.min():.3f}, 90% or more for {np.mean(cover >= 0.9):.1%} of words; by "
        "category (IoU mean/least, covered least): "
        + ", ".join(
            f"{c} {np.mean([f[0] for f in v]):.2f}/{min(f[0] for f in v):.2f}/"
            f"{min(f[1] for f in v):.2f}"
            for c, v in fits.items()
        )
    )
    assert len(fits) == len(CATEGORIES) and len(every) >= 400
    assert along.min() >= 0.6 and along.mean() >= 0.93, (along.min(), along.mean())
    assert cover.min() >= 0.7 and np.mean(cover >= 0.9) >= 0.95, (cover.min(), cover.mean())


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


def test_the_documented_example_reads_as_the_page_is_written(mesh: Mesh) -> None:
    """README's and docs/calling.md's example answer is what the mesh reads on the example
    page, and it is the page's text as written, spaces included."""
    written = ["Invoice 2026-11-23, order KT-48", "Total due: 1284.50 by transfer"]
    page = (ROOT / "docs" / "examples" / "page.jpg").read_bytes()
    assert [line["text"] for line in read(mesh, page)["lines"]] == written
    for doc in ("README.md", "docs/calling.md"):
        shown = re.findall(r'\{"text": "([^"]*)", "score"', (ROOT / doc).read_text())
        assert shown == written, doc


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_a_photo_stored_sideways_reads_as_a_viewer_shows_it(mesh: Mesh, orientation: int) -> None:
    """A phone stores a photo taken sideways as the sensor saw it, with an EXIF orientation
    saying how to turn it. Read as stored, the example page's two lines came back in the
    wrong order (6), and the boxes were in pixels no viewer shows."""
    page = (ROOT / "docs" / "examples" / "page.jpg").read_bytes()
    upright = read(mesh, page)["lines"]
    lines = read(mesh, stored_sideways(page, orientation))["lines"]
    assert [line["text"] for line in lines] == [line["text"] for line in upright]
    for line, want in zip(lines, upright, strict=True):
        assert np.abs(np.array(line["box"]) - np.array(want["box"])).max() < 6


def stored_sideways(jpeg: bytes, orientation: int) -> bytes:
    """The image as a camera held that way stores it: pixels turned, and the EXIF tag that
    turns them back."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(jpeg))
    turn = {3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90,
            8: Image.Transpose.ROTATE_270}  # fmt: skip
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    image.transpose(turn[orientation]).save(out, "JPEG", quality=95, exif=exif.tobytes())
    return out.getvalue()


def test_a_long_receipt_reads_every_line(mesh: Mesh) -> None:
    """A till receipt (392x4423, 200 lines of 16 px) was brought to a long side of 2000
    like any page: its text was 7 px high, and lines were lost or misread (a 514x6772 one
    lost 195 of 250 lines). The detector's bound is now an area (what a square page of
    ~1400 costs), and the lines are cut from the image at up to twice that."""
    sample = receipt(seed=0)
    lines = read(mesh, sample.image)["lines"]
    edits, length = cer([line["text"] for line in lines], sample.lines, spaces=True)
    report(
        f"OCR, a receipt of {len(sample.lines)} lines: {len(lines)} read, "
        f"CER {edits / length:.4f} (spaces counted)"
    )
    assert len(lines) == len(sample.lines)
    assert edits / length <= 0.01
