"""Single-digit images as users send them, rendered from scikit-learn's digits.

Each 8x8 sample (0..16 ink) is drawn the way a photo or scan of one handwritten digit
looks: scaled up with some interpolation, strokes thickened or thinned, turned a little,
placed anywhere in a larger frame, on a grey, coloured or textured background, blurred,
noisy, compressed. A category fixes what varies; everything is drawn from a seeded
generator, so a category's images are the same on every run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import cv2
import numpy as np

from samples.pixels import Colour, contrasting, encode


@dataclass(frozen=True)
class Look:
    """How one digit is drawn."""

    digit_px: int = 48
    """Height of the 8x8 sample's frame once scaled (the digit spans it)."""
    margins: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    """Left, right, top, bottom: fractions of the frame left blank beside the digit."""
    interpolation: int = cv2.INTER_NEAREST
    stroke: float = 0.0
    """Grow (> 0) or shrink (< 0) strokes by this fraction of the digit's height."""
    angle: float = 0.0
    """Degrees, counter-clockwise."""
    blur: float = 0.0
    """Gaussian sigma as a fraction of the digit's height."""
    ink: Colour = (0, 0, 0)
    paper: Colour = (255, 255, 255)
    texture: float = 0.0
    """Amplitude (grey levels) of a smooth paper texture plus grain."""
    noise: float = 0.0
    """Sigma (grey levels) of Gaussian pixel noise."""
    jpeg: int | None = None
    """JPEG quality; PNG when None."""
    transparent: bool = False
    """No paper: the ink's colour everywhere, the strokes in the alpha channel alone (a
    drawing app's PNG export); paper, texture and noise are then left out."""


def draw(values: np.ndarray, look: Look, rng: np.random.Generator) -> np.ndarray:
    """The sample drawn as a BGR image."""
    side = look.digit_px
    ink = cv2.resize(
        (values / 16.0).astype(np.float32), (side, side), interpolation=look.interpolation
    )
    ink = np.clip(ink, 0.0, 1.0)
    radius = round(abs(look.stroke) * side)
    if radius:
        kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))
        ink = (cv2.dilate if look.stroke > 0 else cv2.erode)(ink, kernel)
    if look.angle:
        pad = side // 4
        ink = cv2.copyMakeBorder(ink, pad, pad, pad, pad, cv2.BORDER_CONSTANT, value=0)
        centre = (ink.shape[1] / 2, ink.shape[0] / 2)
        matrix = cv2.getRotationMatrix2D(centre, look.angle, 1.0)
        ink = cv2.warpAffine(ink, matrix, ink.shape[::-1], flags=cv2.INTER_LINEAR)
        ys, xs = np.nonzero(ink > 0.02)
        ink = ink[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
    left, right, top, bottom = look.margins
    h, w = ink.shape
    frame_w = max(w, round(side / max(0.05, 1 - left - right)))
    frame_h = max(h, round(side / max(0.05, 1 - top - bottom)))
    x0 = min(frame_w - w, round(frame_w * left))
    y0 = min(frame_h - h, round(frame_h * top))
    canvas = np.zeros((frame_h, frame_w), np.float32)
    canvas[y0 : y0 + h, x0 : x0 + w] = ink
    if look.blur:
        canvas = cv2.GaussianBlur(canvas, (0, 0), look.blur * side)
    if look.transparent:
        drawn = np.empty((frame_h, frame_w, 4), np.float32)
        drawn[..., :3] = look.ink
        drawn[..., 3] = canvas * 255
        return np.clip(np.round(drawn), 0, 255).astype(np.uint8)
    paper = np.empty((frame_h, frame_w, 3), np.float32)
    paper[:] = look.paper
    if look.texture:
        paper += _texture(frame_h, frame_w, look.texture, rng)[..., np.newaxis]
    alpha = canvas[..., np.newaxis]
    img = paper * (1 - alpha) + np.asarray(look.ink, np.float32) * alpha
    if look.noise:
        img += rng.normal(0, look.noise, img.shape).astype(np.float32)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def _texture(h: int, w: int, amplitude: float, rng: np.random.Generator) -> np.ndarray:
    """Smooth blotches (paper fibres, lighting) plus fine grain."""
    coarse = rng.normal(0, 1, (max(2, h // 24), max(2, w // 24))).astype(np.float32)
    blotches = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
    grain = rng.normal(0, 0.5, (h, w)).astype(np.float32)
    return amplitude * (blotches / max(1e-6, float(np.abs(blotches).max())) + grain)


# ---------------------------------------------------------------- categories

Sampler = Callable[[np.random.Generator], Look]
INTERPOLATIONS = (cv2.INTER_NEAREST, cv2.INTER_LINEAR, cv2.INTER_CUBIC, cv2.INTER_AREA)


def _margins(rng: np.random.Generator, most: float = 0.45) -> tuple[float, float, float, float]:
    """Each side up to `most` of the frame; the digit keeps at least a tenth of each axis."""
    sides = rng.uniform(0, most, 4)
    for a, b in ((0, 1), (2, 3)):
        total = sides[a] + sides[b]
        if total > 0.9:
            sides[[a, b]] *= 0.9 / total
    return tuple(float(s) for s in sides)  # type: ignore[return-value]


def _base(rng: np.random.Generator) -> Look:
    return Look(
        digit_px=int(rng.integers(28, 120)),
        interpolation=int(rng.choice(INTERPOLATIONS)),
        margins=_margins(rng, 0.1),
    )


def _grey(level: float) -> Colour:
    v = int(np.clip(level, 0, 255))
    return (v, v, v)


def _framed(rng: np.random.Generator) -> Look:
    return _base(rng)


def _with_margins(rng: np.random.Generator) -> Look:
    return replace(_base(rng), margins=_margins(rng))


def _light_on_dark(rng: np.random.Generator) -> Look:
    return replace(_with_margins(rng), ink=(255, 255, 255), paper=(0, 0, 0))


def _grey_paper(rng: np.random.Generator) -> Look:
    paper = float(rng.uniform(60, 230))
    contrast = float(rng.uniform(70, 160)) * (1 if paper < 128 else -1)
    return replace(_with_margins(rng), paper=_grey(paper), ink=_grey(paper + contrast))


def _coloured(rng: np.random.Generator) -> Look:
    ink, paper = contrasting(rng, 70)
    return replace(_with_margins(rng), ink=ink, paper=paper)


def _textured(rng: np.random.Generator) -> Look:
    paper = float(rng.uniform(170, 240))
    return replace(
        _with_margins(rng),
        paper=_grey(paper),
        ink=_grey(rng.uniform(0, 80)),
        texture=float(rng.uniform(8, 25)),
        noise=float(rng.uniform(0, 6)),
    )


def _noisy(rng: np.random.Generator) -> Look:
    return replace(_with_margins(rng), noise=float(rng.uniform(8, 30)))


def _blurred(rng: np.random.Generator) -> Look:
    return replace(
        _with_margins(rng),
        interpolation=int(rng.choice([cv2.INTER_LINEAR, cv2.INTER_CUBIC])),
        blur=float(rng.uniform(0.01, 0.05)),
    )


def _strokes(rng: np.random.Generator) -> Look:
    thin = rng.random() < 0.5
    stroke = -float(rng.uniform(0.01, 0.04)) if thin else float(rng.uniform(0.01, 0.06))
    return replace(_with_margins(rng), digit_px=int(rng.integers(48, 120)), stroke=stroke)


def _jpeg(rng: np.random.Generator) -> Look:
    return replace(_with_margins(rng), jpeg=int(rng.integers(15, 60)))


def _rotated(rng: np.random.Generator) -> Look:
    return replace(_with_margins(rng), angle=float(rng.uniform(-10, 10)))


def _sizes(rng: np.random.Generator) -> Look:
    """From a 16 px thumbnail to a phone photo: the frame's side is log-uniform."""
    frame = float(np.exp(rng.uniform(np.log(16), np.log(2400))))
    most = 0.1 if frame < 40 else 0.45
    margins = _margins(rng, most)
    span = min(1 - margins[0] - margins[1], 1 - margins[2] - margins[3])
    return replace(
        _base(rng),
        digit_px=max(12, round(frame * span)),
        margins=margins,
        jpeg=int(rng.integers(70, 95)) if frame > 400 else None,
    )


def _everything(rng: np.random.Generator) -> Look:
    """All of the above at once, milder: what a phone photo of a note looks like."""
    ink, paper = contrasting(rng, 80)
    return replace(
        _sizes(rng),
        ink=ink,
        paper=paper,
        stroke=float(rng.uniform(-0.02, 0.04)),
        angle=float(rng.uniform(-8, 8)),
        blur=float(rng.uniform(0, 0.025)),
        texture=float(rng.uniform(0, 12)),
        noise=float(rng.uniform(0, 12)),
        jpeg=int(rng.integers(30, 90)) if rng.random() < 0.6 else None,
    )


def _canvas(rng: np.random.Generator) -> Look:
    """Drawn in an app and exported on a transparent canvas: dark strokes, or light ones made
    for a dark page (over white, as most viewers show it, those would vanish)."""
    low, high = (190, 256) if rng.random() < 0.5 else (0, 80)
    ink = tuple(int(v) for v in rng.integers(low, high, 3))
    return replace(_with_margins(rng), ink=ink, transparent=True)  # type: ignore[arg-type]


CATEGORIES: dict[str, Sampler] = {
    "framed": _framed,
    "margins": _with_margins,
    "light_on_dark": _light_on_dark,
    "grey_paper": _grey_paper,
    "coloured": _coloured,
    "textured": _textured,
    "noisy": _noisy,
    "blurred": _blurred,
    "strokes": _strokes,
    "jpeg": _jpeg,
    "rotated": _rotated,
    "sizes": _sizes,
    "everything": _everything,
    "canvas": _canvas,  # last: the categories before it keep their seeds
}


@dataclass(frozen=True)
class Sample:
    category: str
    image: bytes
    label: int


def suite(images: np.ndarray, labels: np.ndarray, per_category: int, seed: int = 0) -> list[Sample]:
    """`per_category` images of every category, drawn from the given 8x8 samples."""
    out = []
    for c, (name, sampler) in enumerate(CATEGORIES.items()):
        rng = np.random.default_rng([seed, c])
        picks = rng.choice(len(images), per_category, replace=per_category > len(images))
        for i in picks:
            look = sampler(rng)
            out.append(Sample(name, encode(draw(images[i], look, rng), look.jpeg), int(labels[i])))
    return out


def blank_images(
    count: int, seed: int = 0, texture: float = 8.0, noise: float = 6.0
) -> list[bytes]:
    """Images without a digit: uniform, noisy, textured, coloured, at odd sizes (half of
    them textured up to `texture` grey levels, all with pixel noise of sigma up to `noise`)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        h, w = (int(v) for v in rng.integers(16, 600, 2))
        img = np.empty((h, w, 3), np.float32)
        img[:] = rng.integers(0, 256, 3)
        if rng.random() < 0.5:
            img += _texture(h, w, float(rng.uniform(0, texture)), rng)[..., np.newaxis]
        img += rng.normal(0, float(rng.uniform(0, noise)), img.shape)
        out.append(encode(np.clip(img, 0, 255).astype(np.uint8), None))
    return out


def write_folder(folder: Path, images: np.ndarray, count: int, seed: int = 23) -> dict[str, bytes]:
    """`count` digit photos drawn from `images` (8x8 samples) with every look but the one that
    combines them all (73 ms to draw each; the rest take ~1 ms), PNG or JPEG, one folder per
    look, as a user's folder of scans would be; {path relative to `folder`: image}."""
    looks = [name for name in CATEGORIES if name != "everything"]
    rng = np.random.default_rng(seed)
    out: dict[str, bytes] = {}
    for i in range(count):
        name = looks[i % len(looks)]
        look = CATEGORIES[name](rng)
        blob = encode(draw(images[i % len(images)], look, rng), look.jpeg)
        suffix = "jpg" if blob[:2] == b"\xff\xd8" else "png"
        key = f"{name}/{i:05d}.{suffix}"
        (folder / key).parent.mkdir(parents=True, exist_ok=True)
        (folder / key).write_bytes(blob)
        out[key] = blob
    return out
