"""PP-OCR pre/post-processing as recipe operations (own implementation): the detector's
input here, its boxes and the lines cut along them in preprocess/ocr_crops.py, the per-line
operations in preprocess/ocr_lines.py.

Conventions follow the reference pipeline that ships with the PP-OCR models
(rapidocr-onnxruntime 1.4.4's config.yaml): BGR images, DB thresholds 0.3 / 0.5, unclip
ratio 1.6, classifier input 48x192, recogniser height 48 and width at least 320. Where
we depart from it, measured on the generated text suite (samples/text.py):

- Detection runs at the image's own size (short side at least 64, at most 2 Mpx,
  multiples of 32) instead of upscaling the short side to 736: as accurate, and a 120 px
  line is not blown up to a 4,300x736 tensor. Its bound and that of the image lines are
  cut from are areas, not the reference's long side of 2000 (see ocr_det_prepare).
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

import cv2
import numpy as np

from preprocess.ops import op
from preprocess.state import State
from protos.errors import InvalidInput

# ---------------------------------------------------------------- detection input


def _round32(x: float) -> int:
    return int(round(x / 32) * 32)


def _scale(h: int, w: int, min_side: int, max_side: int, max_pixels: int) -> float:
    """The scale that brings the short side up to `min_side`, unless that takes the long
    side past `max_side` or the area past `max_pixels` (those win)."""
    scale = min_side / min(h, w) if min(h, w) < min_side else 1.0
    return min(scale, max_side / max(h, w), math.sqrt(max_pixels / (h * w)))


def detection_size(
    h: int, w: int, min_side: int, max_side: int, max_pixels: int
) -> tuple[int, int]:
    """(height, width) the detector sees: the image's own scale, unless its short side
    is under `min_side` (scaled up), or its long side over `max_side` or its area over
    `max_pixels` (scaled down); multiples of 32 (the detector's stride), rounded down
    where a bound holds them."""
    scale = _scale(h, w, min_side, max_side, max_pixels)
    sh, sw = max(32, _round32(h * scale)), max(32, _round32(w * scale))
    if sh * sw > max_pixels or max(sh, sw) > max_side:
        sh, sw = max(32, int(h * scale) // 32 * 32), max(32, int(w * scale) // 32 * 32)
    return sh, sw


def _limit(img: np.ndarray, min_side: int, max_side: int, max_pixels: int) -> np.ndarray:
    """The image crops are cut from: as sent, unless a side or its area is out of bounds
    (then, as the reference pipeline does, in multiples of 32)."""
    h, w = img.shape[:2]
    if _scale(h, w, min_side, max_side, max_pixels) == 1.0:
        return img
    sh, sw = detection_size(h, w, min_side, max_side, max_pixels)
    return cv2.resize(img, (sw, sh))


@op
def ocr_det_prepare(
    state: State,
    min_side: int = 64,
    max_side: int = 8192,
    max_pixels: int = 2_000_000,
    image_max_pixels: int = 4_000_000,
    min_side_len: int = 30,
    min_height: int = 30,
    width_height_ratio: float = 8,
    image_output: str = "image",
    transform_output: str = "transform",
) -> None:
    """Bring one image to the detector's size; keep what maps boxes back to it.

    Emits `image` (the image crops are cut from: short side at least `min_side_len`, at
    most `image_max_pixels`) and `transform` [pad_top, pad_left, ratio_h, ratio_w,
    height, width] from `image` to the original. `min_height` and `width_height_ratio`
    pad a flat `image` as the reference pipeline does; `min_side`, `max_side` and
    `max_pixels` size what the detector sees (see `detection_size`).

    The bounds are areas, not the reference's long side of 2000, which brought a receipt
    514x6772 to text 5 px high: 195 of its 250 lines were lost. Areas are what the
    detector's time and memory grow with; at 2 Mpx it reads that receipt whole, and a
    photo 3000x1300 costs it 8% more than at a long side of 2000 (4 Mpx: 44% more). The
    lines are cut from an image of up to `image_max_pixels` (it costs a copy, not a
    detection), so that small text keeps the pixels the recogniser reads.
    """
    if len(state.images) != 1:
        raise InvalidInput(f"text detection takes one image per request, got {len(state.images)}")
    raw = state.images[0]
    # Boxes answer in the pixels of the image as sent, which a JPEG decoded smaller is not.
    raw_h, raw_w = state.sizes[0] if state.sizes else raw.shape[:2]
    img = _limit(raw, min_side_len, max_side, image_max_pixels)
    h, w = img.shape[:2]
    state.tensors[image_output] = np.ascontiguousarray(img)
    # Very flat images (one line of text) get blank bands above and below, for the
    # detector only: `image` is sent on as it is (a 2000x25 line once went padded to
    # 2000x500, 3 MB of black between the services), and ocr_crops takes the bands off.
    pad_top = 0
    if h <= min_height or w / h > width_height_ratio:
        pad_top = int(abs(max(int(w / width_height_ratio), min_height) * 2 - h) / 2)
    state.tensors[transform_output] = np.array(
        [pad_top, 0, raw_h / h, raw_w / w, raw_h, raw_w], dtype=np.float32
    )
    padded_h = h + 2 * pad_top
    rh, rw = detection_size(padded_h, w, min_side, max_side, max_pixels)
    if (rh, rw) == (padded_h, w) and not pad_top:
        state.images = [img]
        return
    # Resized, then padded: the bands cost no resizing, and a padded 8192x2048 line is
    # never made whole.
    content = max(1, min(rh, round(h * rh / padded_h)))
    top = (rh - content) // 2
    det = cv2.resize(img, (rw, content)) if (content, rw) != (h, w) else img
    state.images = [
        cv2.copyMakeBorder(det, top, rh - content - top, 0, 0, cv2.BORDER_CONSTANT, value=0)
    ]
