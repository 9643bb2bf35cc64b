"""Training images for the digits classifiers: data-set samples drawn as users' images.

The classifiers are trained on what the `digits` recipe makes of images, not on the data
set's 8x8 values, so that training and serving see the same features. Each training sample
is drawn several times with a seeded generator: scaled up with one of OpenCV's
interpolations, strokes thickened or thinned, turned up to 12 degrees, moved anywhere in a
larger frame, blurred, on paper of any grey level with ink of either polarity, noisy,
sometimes JPEG-compressed. Only the training split is drawn; the held-out split stays
untouched.
"""

from __future__ import annotations

import cv2
import numpy as np

_INTERPOLATIONS = (cv2.INTER_NEAREST, cv2.INTER_LINEAR, cv2.INTER_CUBIC, cv2.INTER_AREA)


def render(values: np.ndarray, rng: np.random.Generator) -> bytes:
    """One 8x8 sample (0..16 ink) as an encoded image, its look drawn from `rng`."""
    side = int(rng.integers(16, 96))
    interpolation = int(rng.choice(_INTERPOLATIONS))
    cover = cv2.resize(
        (values / 16.0).astype(np.float32), (side, side), interpolation=interpolation
    )
    cover = np.clip(cover, 0.0, 1.0)
    radius = round(float(rng.uniform(-0.04, 0.06)) * side)
    if radius:
        kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * abs(radius) + 1,) * 2)
        cover = (cv2.dilate if radius > 0 else cv2.erode)(cover, kernel)
    pad = side // 2 + 2
    cover = cv2.copyMakeBorder(cover, pad, pad, pad, pad, cv2.BORDER_CONSTANT, value=0)
    h, w = cover.shape
    matrix = cv2.getRotationMatrix2D((w / 2, h / 2), float(rng.uniform(-12, 12)), 1.0)
    matrix[:, 2] += rng.uniform(-0.8 * pad, 0.8 * pad, 2)
    cover = cv2.warpAffine(cover, matrix, (w, h))
    sigma = float(rng.uniform(0, 0.04)) * side
    if sigma > 0.3:
        cover = cv2.GaussianBlur(cover, (0, 0), sigma)
    paper = float(rng.uniform(0, 255))
    ink = paper + float(rng.choice([-1.0, 1.0]) * rng.uniform(60, 255))
    ink = float(np.clip(ink, 0, 255))
    if abs(ink - paper) < 50:
        ink = 255.0 if paper < 128 else 0.0
    img = paper * (1 - cover) + ink * cover
    img += rng.normal(0, float(rng.uniform(0, 15)), img.shape)
    img = np.clip(np.round(img), 0, 255).astype(np.uint8)
    if rng.random() < 0.4:
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(20, 95))])
    else:
        ok, buf = cv2.imencode(".png", img)
    assert ok
    return buf.tobytes()
