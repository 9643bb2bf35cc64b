"""PP-OCR pre/post-processing as recipe operations (own implementation).

Conventions follow the reference pipeline that ships with the PP-OCR models
(rapidocr-onnxruntime 1.4.4's config.yaml): BGR images, DB thresholds 0.3 / 0.5, unclip
ratio 1.6, classifier input 48x192, recogniser height 48 and width at least 320. Where
we depart from it, measured on the generated text suite (tests/inputs/text.py):

- Detection runs at the image's own size (short side at least 64, long side at most
  4000, multiples of 32) instead of upscaling the short side to 736: as accurate, and a
  120 px line is not blown up to a 4,300x736 tensor.
- The direction classifier sees windows of a line at its own aspect (up to four along
  a long line, probabilities averaged) instead of the whole line squeezed into 192 px,
  which turned long lines upside down.
- The models take UINT8 images (NHWC) and normalise inside the graph (models/ocr.py),
  and the recogniser answers the best character and its probability per step; so
  every tensor between the steps is bytes or small.
- The recogniser runs each line alone at its own width (`ragged` in its config) instead
  of a batch padded to the widest line: faster on a CPU (no padding; ONNX Runtime's
  per-column cost also grows with the batch) and a line's reading no longer depends on
  the other lines of its page.
"""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np

from preprocess.images import convert
from preprocess.ops import ceil_width, op
from preprocess.state import State
from protos.errors import InvalidInput

# ---------------------------------------------------------------- detection input


def _round32(x: float) -> int:
    return int(round(x / 32) * 32)


def _limit_sides(img: np.ndarray, max_side: int, min_side: int) -> np.ndarray:
    h, w = img.shape[:2]
    if max(h, w) > max_side:
        r = max_side / max(h, w)
        img = cv2.resize(img, (max(32, _round32(int(w * r))), max(32, _round32(int(h * r)))))
    h, w = img.shape[:2]
    if min(h, w) < min_side:
        r = min_side / min(h, w)
        img = cv2.resize(img, (max(32, _round32(int(w * r))), max(32, _round32(int(h * r)))))
    return img


def detection_size(h: int, w: int, min_side: int, max_side: int) -> tuple[int, int]:
    """(height, width) the detector sees: the image's own scale, unless its short side
    is under `min_side` (scaled up) or its long side over `max_side` (scaled down);
    multiples of 32 (the detector's stride)."""
    scale = 1.0
    if min(h, w) < min_side:
        scale = min_side / min(h, w)
    if max(h, w) * scale > max_side:
        scale = max_side / max(h, w)
    return max(32, _round32(h * scale)), max(32, _round32(w * scale))


@op
def ocr_det_prepare(
    state: State,
    min_side: int = 64,
    max_side: int = 2000,
    max_side_len: int = 2000,
    min_side_len: int = 30,
    min_height: int = 30,
    width_height_ratio: float = 8,
    image_output: str = "image",
    transform_output: str = "transform",
) -> None:
    """Bring one image to the detector's size; keep what maps boxes back to it.

    Emits `image` (the image crops are cut from) and `transform`
    [pad_top, pad_left, ratio_h, ratio_w, height, width] from `image` to the original.
    `max_side_len`, `min_side_len`, `min_height` and `width_height_ratio` shape `image`
    as the reference pipeline does; `min_side` and `max_side` size what the detector sees
    (see `detection_size`).
    """
    if len(state.images) != 1:
        raise InvalidInput(f"text detection takes one image per request, got {len(state.images)}")
    raw = state.images[0]
    raw_h, raw_w = raw.shape[:2]
    img = _limit_sides(raw, max_side_len, min_side_len)
    h, w = img.shape[:2]
    pad_top = 0
    if h <= min_height or w / h > width_height_ratio:
        # Very flat images (one line of text) get blank bands above and below.
        new_h = max(int(w / width_height_ratio), min_height) * 2
        pad_top = int(abs(new_h - h) / 2)
        img = cv2.copyMakeBorder(img, pad_top, pad_top, 0, 0, cv2.BORDER_CONSTANT, value=(0, 0, 0))
    state.tensors[image_output] = np.ascontiguousarray(img)
    state.tensors[transform_output] = np.array(
        [pad_top, 0, raw_h / h, raw_w / w, raw_h, raw_w], dtype=np.float32
    )
    ih, iw = img.shape[:2]
    rh, rw = detection_size(ih, iw, min_side, max_side)
    state.images = [cv2.resize(img, (rw, rh)) if (rh, rw) != (ih, iw) else img]


# ---------------------------------------------------------------- boxes and crops


def _mini_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """The minimum-area rectangle's corners (tl, tr, br, bl) and its shorter side."""
    rect = cv2.minAreaRect(contour)
    pts = sorted(cv2.boxPoints(rect).tolist(), key=lambda p: p[0])
    left = sorted(pts[:2], key=lambda p: p[1])
    right = sorted(pts[2:], key=lambda p: p[1])
    box = np.array([left[0], right[0], right[1], left[1]], dtype=np.float32)
    return box, min(rect[1])


def _box_score(prob: np.ndarray, box: np.ndarray) -> float:
    """Mean probability inside the box (the "fast" DB score)."""
    h, w = prob.shape
    xmin = int(np.clip(np.floor(box[:, 0].min()), 0, w - 1))
    xmax = int(np.clip(np.ceil(box[:, 0].max()), 0, w - 1))
    ymin = int(np.clip(np.floor(box[:, 1].min()), 0, h - 1))
    ymax = int(np.clip(np.ceil(box[:, 1].max()), 0, h - 1))
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), dtype=np.uint8)
    shifted = (box - np.array([xmin, ymin], np.float32)).astype(np.int32)
    cv2.fillPoly(mask, shifted.reshape(1, -1, 2), 1)
    return float(cv2.mean(prob[ymin : ymax + 1, xmin : xmax + 1], mask)[0])


def _unclip(box: np.ndarray, ratio: float) -> np.ndarray:
    """Grow a rectangle by area*ratio/perimeter on every side.

    Offsetting a rectangle outwards with round joins and taking the minimum-area
    rectangle of the result gives exactly this: the same rectangle, each side
    pushed out by the offset distance.
    """
    area = cv2.contourArea(box)
    perimeter = cv2.arcLength(box.reshape(-1, 1, 2), True)
    if perimeter == 0:
        return box
    distance = area * ratio / perimeter
    (cx, cy), (rw, rh), angle = cv2.minAreaRect(box)
    grown = ((cx, cy), (rw + 2 * distance, rh + 2 * distance), angle)
    return cv2.boxPoints(grown).astype(np.float32)


def db_boxes(
    prob: np.ndarray,
    dest_w: int,
    dest_h: int,
    *,
    thresh: float,
    box_thresh: float,
    max_candidates: int,
    unclip_ratio: float,
    use_dilation: bool,
    min_size: int,
) -> list[np.ndarray]:
    """Differentiable-binarisation post-processing: text boxes in destination pixels."""
    h, w = prob.shape
    bitmap = (prob > thresh).astype(np.uint8)
    if use_dilation:
        bitmap = cv2.dilate(bitmap, np.ones((2, 2), np.uint8))
    contours, _ = cv2.findContours(bitmap * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes = []
    for contour in contours[:max_candidates]:
        points, side = _mini_box(contour)
        if side < min_size:
            continue
        if _box_score(prob, points) < box_thresh:
            continue
        grown, side = _mini_box(_unclip(points, unclip_ratio).reshape(-1, 1, 2))
        if side < min_size + 2:
            continue
        grown[:, 0] = np.clip(np.round(grown[:, 0] / w * dest_w), 0, dest_w)
        grown[:, 1] = np.clip(np.round(grown[:, 1] / h * dest_h), 0, dest_h)
        boxes.append(grown.astype(np.int32).astype(np.float32))
    return boxes


def _clockwise(pts: np.ndarray) -> np.ndarray:
    xs = pts[np.argsort(pts[:, 0])]
    left = xs[:2][np.argsort(xs[:2, 1])]
    right = xs[2:][np.argsort(xs[2:, 1])]
    return np.array([left[0], right[0], right[1], left[1]], dtype=np.float32)


def _tidy(boxes: list[np.ndarray], h: int, w: int) -> list[np.ndarray]:
    out = []
    for box in boxes:
        box = _clockwise(box)
        box[:, 0] = np.clip(box[:, 0], 0, w - 1).astype(np.int32)
        box[:, 1] = np.clip(box[:, 1], 0, h - 1).astype(np.int32)
        if int(np.linalg.norm(box[0] - box[1])) <= 3 or int(np.linalg.norm(box[0] - box[3])) <= 3:
            continue
        out.append(box)
    return out


def reading_order(boxes: list[np.ndarray]) -> list[np.ndarray]:
    """Top to bottom, then left to right within a line.

    A box belongs to the line above when its vertical centre falls inside that line's
    first box: robust to the detector splitting one line into boxes whose tops differ
    (a fixed pixel tolerance on the tops misorders those).
    """
    lines: list[list[np.ndarray]] = []
    for box in sorted(boxes, key=lambda b: float(b[:, 1].mean())):
        centre = float(box[:, 1].mean())
        if lines:
            first = lines[-1][0]
            if float(first[:, 1].min()) <= centre <= float(first[:, 1].max()):
                lines[-1].append(box)
                continue
        lines.append([box])
    return [box for line in lines for box in sorted(line, key=lambda b: float(b[:, 0].min()))]


def perspective_crop(img: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The quadrilateral `box` of `img`, straightened; tall crops are turned upright."""
    width = int(max(np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[2] - box[3])))
    height = int(max(np.linalg.norm(box[0] - box[3]), np.linalg.norm(box[1] - box[2])))
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=np.float32)
    matrix = cv2.getPerspectiveTransform(box.astype(np.float32), target)
    crop = cv2.warpPerspective(
        img, matrix, (width, height), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC
    )
    if crop.shape[0] / max(crop.shape[1], 1) >= 1.5:
        crop = np.rot90(crop)
    return np.ascontiguousarray(crop)


@op
def ocr_crops(
    state: State,
    map: str = "maps",
    image: str = "image",
    transform: str = "transform",
    thresh: float = 0.3,
    box_thresh: float = 0.5,
    max_candidates: int = 1000,
    unclip_ratio: float = 1.6,
    use_dilation: bool = True,
    min_size: int = 3,
    boxes_output: str = "boxes",
) -> None:
    """Text-line crops (into state.images) and their boxes in original-image pixels."""
    prob, img, tf = state.tensor(map), state.tensor(image), state.tensor(transform)
    if prob.ndim != 4 or prob.shape[:2] != (1, 1) or 0 in prob.shape:
        raise InvalidInput(f"input '{map}': expected [1,1,H,W], got {list(prob.shape)}")
    if img.ndim != 3 or img.dtype != np.uint8 or 0 in img.shape or img.shape[2] not in (1, 3):
        raise InvalidInput(f"input '{image}': expected UINT8 [H,W,3], got {list(img.shape)}")
    if tf.shape != (6,):
        raise InvalidInput(f"input '{transform}': expected 6 values, got {list(tf.shape)}")
    h, w = img.shape[:2]
    boxes = db_boxes(
        prob[0, 0],
        w,
        h,
        thresh=thresh,
        box_thresh=box_thresh,
        max_candidates=max_candidates,
        unclip_ratio=unclip_ratio,
        use_dilation=use_dilation,
        min_size=min_size,
    )
    boxes = reading_order(_tidy(boxes, h, w))
    state.images = [perspective_crop(img, box) for box in boxes]
    pad_top, pad_left, ratio_h, ratio_w, raw_h, raw_w = tf.tolist()
    original = np.array(boxes, dtype=np.float32).reshape(-1, 4, 2)
    original[..., 0] = np.clip((original[..., 0] - pad_left) * ratio_w, 0, raw_w)
    original[..., 1] = np.clip((original[..., 1] - pad_top) * ratio_h, 0, raw_h)
    state.tensors[boxes_output] = original


# ---------------------------------------------------------------- classifier / recogniser


PAD = 128
"""Fills the right of shorter crops in a batch: mid-grey, what PaddleOCR's zero after
normalisation (pixel 127.5) comes closest to in a byte."""


def _paddle_batch(images: list[np.ndarray], height: int, width: int) -> np.ndarray:
    """Crops as one UINT8 [N, height, width, 3] batch: each resized to `height` keeping its
    aspect (at most `width` wide), padded on the right with mid-grey. The models normalise
    (pixel / 127.5 - 1) inside their graphs."""
    batch = np.full((len(images), height, width, 3), PAD, np.uint8)
    for i, im in enumerate(images):
        resized_w = ceil_width(im.shape[0], im.shape[1], height, width)
        batch[i, :, :resized_w] = cv2.resize(convert(im, "bgr"), (resized_w, height))
    return batch


def cls_windows(h: int, w: int, aspect: float = 4.0, most: int = 4) -> list[tuple[int, int]]:
    """Column ranges of a crop that the direction classifier looks at.

    The classifier's input is `aspect` times as wide as high; a longer line squeezed into
    it reads as noise (measured: long lines turned upside down). So a long line is seen
    through up to `most` windows of that aspect, spread evenly along it.
    """
    window = max(1, round(aspect * h))
    if w <= 1.5 * window:
        return [(0, w)]
    count = min(most, math.ceil(w / window))
    starts = np.linspace(0, w - window, count).round().astype(int)
    return [(int(x), int(x) + window) for x in starts]


@op
def ocr_cls_batch(state: State, output: str = "x", height: int = 48, width: int = 192) -> None:
    """Crops as the direction classifier's UINT8 [M,48,192,3] input: the windows of every
    crop (`cls_windows`), in crop order."""
    windows = [
        im[:, x0:x1]
        for im in state.images
        for x0, x1 in cls_windows(im.shape[0], im.shape[1], width / height)
    ]
    state.tensors[output] = _paddle_batch(windows, height, width)


@op
def rotate_by_class(
    state: State,
    probs: str = "probs",
    index: int = 1,
    threshold: float = 0.9,
    boxes: str | None = None,
    height: int = 48,
    width: int = 192,
) -> None:
    """Turn crops 180 degrees where class `index` (upside down) scores above `threshold`
    for the crop as a whole: the mean log-odds of its windows (`cls_windows` with the
    classifier's `height` and `width`: one row of `probs` per window). Measured on 2,362
    lines of the generated suite against the mean of probabilities (3 wrong), the median
    (0 wrong, narrow margin) and summed log-odds (2 wrong: overconfident when windows
    disagree): 0 wrong, upright lines scoring at most 0.76 and upside-down ones at least
    0.98 against the threshold of 0.9.

    With `boxes`: when most crops were upside down the page itself is, so its reading
    order runs backwards; crops and boxes are then reversed to read naturally.
    """
    p = state.tensor(probs)
    counts = [len(cls_windows(im.shape[0], im.shape[1], width / height)) for im in state.images]
    if p.ndim != 2 or p.shape[0] != sum(counts) or p.shape[1] <= index:
        raise InvalidInput(
            f"input '{probs}': expected [{sum(counts)}, >{index}] (one row per window of "
            f"{len(state.images)} crops), got {list(p.shape)}"
        )
    q = np.clip(p[:, index].astype(np.float64), 1e-6, 1 - 1e-6)
    starts = np.cumsum([0, *counts[:-1]]).astype(int)
    evidence = np.add.reduceat(np.log(q / (1 - q)), starts) if counts else np.zeros(0)
    per_crop = 1 / (1 + np.exp(-evidence / np.maximum(1, counts)))
    flipped = per_crop > threshold
    state.images = [
        cv2.rotate(im, cv2.ROTATE_180) if flipped[i] else im for i, im in enumerate(state.images)
    ]
    if boxes is not None:
        b = state.tensor(boxes)
        if b.shape[:1] != (len(state.images),):
            raise InvalidInput(
                f"input '{boxes}' has {b.shape[0]} boxes for {len(state.images)} crops"
            )
        if flipped.sum() * 2 > len(flipped):
            state.images = state.images[::-1]
            state.tensors[boxes] = b[::-1].copy()


@op
def ocr_rec_batch(
    state: State,
    output: str = "x",
    widths_output: str = "widths",
    height: int = 48,
    min_width: int = 320,
) -> None:
    """Crops as the recogniser's UINT8 [N,48,W,3] input, W fitting the widest crop, and
    each row's own width (INT32 [N], at least `min_width`): the recogniser runs each line
    at its width (its `ragged` config), not the padded batch's."""
    ratios = [im.shape[1] / im.shape[0] for im in state.images]
    width = int(height * max([min_width / height, *ratios]))
    state.tensors[output] = _paddle_batch(state.images, height, width)
    state.tensors[widths_output] = np.array(
        [
            max(min_width, ceil_width(im.shape[0], im.shape[1], height, width))
            for im in state.images
        ],
        dtype=np.int32,
    )


# ---------------------------------------------------------------- CTC decoding


_CHARSETS: dict[Path, list[str]] = {}


def charset(path: Path) -> list[str]:
    """Index 0 is the CTC blank; the file's characters follow, then a space."""
    if path not in _CHARSETS:
        chars = path.read_text(encoding="utf-8").split("\n")
        if chars and chars[-1] == "":
            chars.pop()
        _CHARSETS[path] = ["", *chars, " "]
    return _CHARSETS[path]


def ctc_greedy(index: np.ndarray, prob: np.ndarray, chars: list[str]) -> list[tuple[str, float]]:
    """Best path from the recogniser's best class and its probability per step: merge
    repeats, drop blanks; score = mean probability of the kept steps."""
    out = []
    for idx, p in zip(index, prob, strict=True):
        keep = np.ones(len(idx), dtype=bool)
        keep[1:] = idx[1:] != idx[:-1]
        keep &= idx != 0
        text = "".join(chars[i] for i in idx[keep])
        out.append((text, float(np.mean(p[keep])) if keep.any() else 0.0))
    return out


def latin_punctuation(text: str) -> str:
    """Full-width forms (U+FF01..U+FF5E: comma U+FF0C, colon U+FF1A, ...) read inside
    Latin text become their ASCII twins. The recogniser knows both, as Chinese text uses
    the full-width ones, and after a Latin word it sometimes picks the full-width comma
    (seen on the generated suite); a full-width sign whose nearest characters on both
    sides are ASCII is the ASCII one."""
    if not any("\uff01" <= c <= "\uff5e" for c in text):
        return text
    chars = list(text)
    for i, c in enumerate(chars):
        if not "\uff01" <= c <= "\uff5e":
            continue
        before = text[:i].rstrip()[-1:]
        after = text[i + 1 :].lstrip()[:1]
        if all(n == "" or n.isascii() for n in (before, after)) and (before or after):
            chars[i] = chr(ord(c) - 0xFEE0)
    return "".join(chars)


@op
def ocr_ctc_decode(
    state: State,
    characters_file: str,
    index: str = "index",
    prob: str = "prob",
    boxes: str = "boxes",
    min_score: float = 0.5,
    text_output: str = "text",
    score_output: str = "score",
    boxes_output: str = "boxes",
) -> None:
    """Best class per step -> text and confidence per line (lines under min_score drop)."""
    chars = charset(Path(characters_file))
    idx, p = state.tensor(index), state.tensor(prob)
    if idx.ndim != 2 or p.shape != idx.shape:
        raise InvalidInput(
            f"inputs '{index}' {list(idx.shape)} and '{prob}' {list(p.shape)} must both be [N,T]"
        )
    if idx.size and (idx.min() < 0 or idx.max() >= len(chars)):
        raise InvalidInput(
            f"input '{index}' holds classes outside this character list (0..{len(chars) - 1})"
        )
    decoded = ctc_greedy(idx, p, chars)
    box = state.tensors.get(boxes)
    if box is not None and box.shape[0] != len(decoded):
        raise InvalidInput(f"input '{boxes}' has {box.shape[0]} boxes for {len(decoded)} lines")
    keep = [i for i, (text, score) in enumerate(decoded) if text and score >= min_score]
    state.tensors[text_output] = np.array(
        [latin_punctuation(decoded[i][0]).encode() for i in keep] or [], dtype=object
    )
    state.tensors[score_output] = np.array([decoded[i][1] for i in keep], dtype=np.float32)
    state.tensors[boxes_output] = (
        box[keep].reshape(-1, 4, 2).astype(np.float32)
        if box is not None
        else np.zeros((len(keep), 4, 2), np.float32)  # no boxes given: none to report
    )
