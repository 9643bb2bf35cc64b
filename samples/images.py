"""Test images made here: rendered digits and text lines, encoded like uploads."""

from __future__ import annotations

import cv2
import numpy as np
from rapidfuzz.distance import Levenshtein

FONTS = [
    cv2.FONT_HERSHEY_SIMPLEX,
    cv2.FONT_HERSHEY_DUPLEX,
    cv2.FONT_HERSHEY_COMPLEX,
    cv2.FONT_HERSHEY_TRIPLEX,
]


def encode(img: np.ndarray, ext: str = ".png") -> bytes:
    ok, buf = cv2.imencode(ext, img)
    assert ok
    return buf.tobytes()


def render_digit(values: np.ndarray, scale: int = 8) -> np.ndarray:
    """An 8x8 digits-data sample (0..16, ink high) as dark-on-light gray pixels."""
    gray = np.round(255 - values * (255 / 16)).astype(np.uint8)
    return cv2.resize(gray, (8 * scale, 8 * scale), interpolation=cv2.INTER_NEAREST)


def render_lines(
    lines: list[str], font: int = FONTS[0], scale: float = 1.0, thickness: int = 2, margin: int = 20
) -> tuple[np.ndarray, list[tuple]]:
    """Black text on white, one line per entry; returns the image and each line's bbox."""
    sizes = [cv2.getTextSize(t, font, scale, thickness) for t in lines]
    width = max(w for (w, _), _ in sizes) + 2 * margin
    line_h = max(h + b for (_, h), b in sizes) + margin
    img = np.full((line_h * len(lines) + margin, width, 3), 255, np.uint8)
    boxes = []
    for i, (text, ((w, h), base)) in enumerate(zip(lines, sizes, strict=True)):
        y = margin + i * line_h + h
        cv2.putText(img, text, (margin, y), font, scale, (0, 0, 0), thickness, cv2.LINE_AA)
        boxes.append((margin, y - h, margin + w, y + base))
    return img, boxes


# Letters, digits and punctuation, less the glyphs these fonts draw alike (O/0, l/I/1).
TEXT_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz0123456789.,:;!?-()'"


def text_samples(count: int, seed: int = 0) -> list[tuple[bytes, list[str]]]:
    """Encoded images of 1-3 lines of 5-40 random characters, several fonts and sizes,
    every third one upside down (a page turned over still reads first line first);
    with the true lines."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(count):
        lines = []
        for _ in range(int(rng.integers(1, 4))):
            n = int(rng.integers(5, 41))
            words, left = [], n
            while left > 0:
                k = int(min(left, rng.integers(2, 9)))
                words.append("".join(rng.choice(list(TEXT_CHARS), k)))
                left -= k + 1
            lines.append(" ".join(words)[:n].strip())
        font = FONTS[i % len(FONTS)]
        scale = float(rng.choice([0.9, 1.1, 1.4]))
        img, _ = render_lines(lines, font=font, scale=scale, thickness=2)
        if i % 3 == 2:
            img = cv2.rotate(img, cv2.ROTATE_180)
        samples.append((encode(img), lines))
    return samples


def cer(predicted: list[str], truth: list[str], spaces: bool = False) -> tuple[int, int]:
    """(edit distance, reference length) over all lines joined: spaces ignored, or with
    `spaces` counted as a reader sees them (lines joined by one, runs of them as one)."""
    if spaces:
        a = " ".join(" ".join(line.split()) for line in predicted).strip()
        b = " ".join(" ".join(line.split()) for line in truth).strip()
    else:
        a = "".join(predicted).replace(" ", "")
        b = "".join(truth).replace(" ", "")
    return Levenshtein.distance(a, b), len(b)


def word_box_fit(truth: np.ndarray | list, box: np.ndarray | list) -> tuple[float, float]:
    """How well a word's `box` (four corners, clockwise from its top-left as read) fits the
    word as drawn (`truth`, the same): (intersection over union along the line, measured
    on the box's top edge's direction; the share of the truth's area the box covers). A
    word box is as tall as its line's box, so an overlap of areas would mostly measure the
    line's height; these two measure where the word starts and ends, and that it is all
    inside."""
    t, b = np.asarray(truth, np.float64).reshape(-1, 2), np.asarray(box, np.float64).reshape(-1, 2)
    along = (b[1] - b[0]) / max(float(np.linalg.norm(b[1] - b[0])), 1e-9)
    (t0, t1), (b0, b1) = ((float(q.min()), float(q.max())) for q in (t @ along, b @ along))
    union = max(t1, b1) - min(t0, b0)
    iou = max(0.0, min(t1, b1) - max(t0, b0)) / union if union > 0 else 0.0
    hulls = [cv2.convexHull(q.astype(np.float32)) for q in (t, b)]
    inter, _ = cv2.intersectConvexConvex(*hulls)
    area = cv2.contourArea(hulls[0])
    return iou, float(inter / area) if area > 0 else 0.0
