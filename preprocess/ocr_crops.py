"""PP-OCR's text boxes from the detector's probability map, in reading order, and the
lines cut out along them (own implementation; conventions and departures from the
reference pipeline: preprocess/ocr.py)."""

from __future__ import annotations

import math

import cv2
import numpy as np

from preprocess.ops import op
from preprocess.state import State
from protos.errors import InvalidInput


def _clockwise(pts: np.ndarray) -> np.ndarray:
    """A quadrilateral's corners as (tl, tr, br, bl): the two leftmost, top first, then
    the two rightmost, top first (stable sorts, as PaddleOCR orders them)."""
    xs = pts[np.argsort(pts[:, 0], kind="stable")]
    left = xs[:2][np.argsort(xs[:2, 1], kind="stable")]
    right = xs[2:][np.argsort(xs[2:, 1], kind="stable")]
    return np.array([left[0], right[0], right[1], left[1]], dtype=np.float32)


def _mini_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """The minimum-area rectangle's corners (tl, tr, br, bl) and its shorter side."""
    rect = cv2.minAreaRect(contour)
    return _clockwise(cv2.boxPoints(rect)), min(rect[1])


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


def perspective_crop(img: np.ndarray, box: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The quadrilateral `box` of `img`, straightened (tall crops turned upright), and the
    3x3 matrix taking the crop's pixels back to `img`'s (word boxes are found in the crop)."""
    width = int(max(np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[2] - box[3])))
    height = int(max(np.linalg.norm(box[0] - box[3]), np.linalg.norm(box[1] - box[2])))
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=np.float32)
    matrix = cv2.getPerspectiveTransform(box.astype(np.float32), target)
    crop = cv2.warpPerspective(
        img, matrix, (width, height), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC
    )
    back = np.linalg.inv(matrix)
    if crop.shape[0] / max(crop.shape[1], 1) >= 1.5:
        crop = np.rot90(crop)  # a quarter turn anticlockwise: (x, y) came from (width - y, x)
        back = back @ np.array([[0, -1, width], [1, 0, 0], [0, 0, 1]], np.float64)
    return np.ascontiguousarray(crop), back


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
    to_image_output: str = "to_image",
) -> None:
    """Text-line crops (into state.images), their boxes in original-image pixels, and for
    each a 3x3 matrix from the crop's pixels to the original image's (FP32 [N,3,3]; the
    crop's later turns and resizes update it: preprocess/ocr_lines.py)."""
    prob, img, tf = state.tensor(map), state.tensor(image), state.tensor(transform)
    if prob.ndim != 4 or prob.shape[:2] != (1, 1) or 0 in prob.shape:
        raise InvalidInput(f"input '{map}': expected [1,1,H,W], got {list(prob.shape)}")
    if img.ndim != 3 or img.dtype != np.uint8 or 0 in img.shape or img.shape[2] not in (1, 3):
        raise InvalidInput(f"input '{image}': expected UINT8 [H,W,3], got {list(img.shape)}")
    if tf.shape != (6,):
        raise InvalidInput(f"input '{transform}': expected 6 values, got {list(tf.shape)}")
    h, w = img.shape[:2]
    pad_top, pad_left, ratio_h, ratio_w, raw_h, raw_w = tf.tolist()
    # What ocr_det_prepare makes; anything else (NaN, a band of 1e30) answered boxes of NaN.
    pads_fit = all(0 <= pad <= max(h, w, 32) for pad in (pad_top, pad_left))
    if not (pads_fit and all(0 < v < math.inf for v in (ratio_h, ratio_w, raw_h, raw_w))):
        raise InvalidInput(
            f"input '{transform}': expected [pad_top, pad_left, ratio_h, ratio_w, height, "
            f"width] with bands of 0 to {max(h, w, 32)} and the rest finite and over 0, got "
            f"{tf.tolist()}"
        )
    # The map covers `image` with the bands ocr_det_prepare added for the detector; boxes
    # come back in `image`'s pixels, bands taken off (and then clipped to it by _tidy).
    boxes = db_boxes(
        prob[0, 0],
        w + 2 * round(pad_left),
        h + 2 * round(pad_top),
        thresh=thresh,
        box_thresh=box_thresh,
        max_candidates=max_candidates,
        unclip_ratio=unclip_ratio,
        use_dilation=use_dilation,
        min_size=min_size,
    )
    shift = np.array([round(pad_left), round(pad_top)], np.float32)
    boxes = reading_order(_tidy([box - shift for box in boxes], h, w))
    cut = [perspective_crop(img, box) for box in boxes]
    state.images = [crop for crop, _ in cut]
    to_original = np.array([[ratio_w, 0, 0], [0, ratio_h, 0], [0, 0, 1]])
    state.tensors[to_image_output] = np.array(
        [to_original @ back for _, back in cut], np.float32
    ).reshape(-1, 3, 3)
    original = np.array(boxes, dtype=np.float64).reshape(-1, 4, 2)
    if len(original):
        original = cv2.perspectiveTransform(original.reshape(1, -1, 2), to_original)
    original = np.clip(original.reshape(-1, 4, 2), 0, [raw_w, raw_h]).astype(np.float32)
    state.tensors[boxes_output] = original
