"""Text drawn as users photograph or scan it (samples/text.py picks what to draw), with the
truth about where every word landed: its box in the final image's pixels, through the
perspective and the turn the look applies."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from samples.pixels import Colour

_FONT_FILES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSansMono.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "cmss10.ttf",
)


@cache
def fonts() -> tuple[Path, ...]:
    import matplotlib

    folder = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    return tuple(folder / name for name in _FONT_FILES)


@dataclass(frozen=True)
class Look:
    """How a text image is drawn."""

    lines: int = 1
    size: int = 24
    """Text height in pixels (the font's size: ascender to descender)."""
    font: int = 0
    ink: Colour = (0, 0, 0)
    paper: Colour = (255, 255, 255)
    paper_to: Colour | None = None
    """Paper colour at the far end of a linear gradient (None: flat paper)."""
    margin: float = 0.6
    """Blank space around the text, in text heights."""
    spacing: float = 1.5
    """Line pitch, in text heights."""
    upside_down: bool = False
    perspective: float = 0.0
    """Corners moved by up to this fraction of the image's sides."""
    blur: float = 0.0
    """Gaussian sigma, in text heights."""
    noise: float = 0.0
    """Sigma (grey levels) of Gaussian pixel noise."""
    jpeg: int | None = None


WordBox = tuple[str, np.ndarray]
"""A word and its box: float [4,2], clockwise from the word's top-left as written, in the
final image's pixels. Across: the word's ink; down: the ink of its whole line (a word box
spans its line's height, as a reader's highlight does)."""


def drawn(
    text: list[str], look: Look, rng: np.random.Generator
) -> tuple[np.ndarray, list[list[WordBox]]]:
    """The lines drawn as a BGR image, and each line's words with their boxes."""
    font = ImageFont.truetype(str(fonts()[look.font % len(fonts())]), look.size)
    widths = [font.getlength(line) for line in text]
    pitch = round(look.spacing * look.size)
    margin = round(look.margin * look.size) + 2
    indents = [int(rng.integers(0, max(1, look.size * 2))) if len(text) > 1 else 0 for _ in text]
    width = int(max(w + i for w, i in zip(widths, indents, strict=True))) + 2 * margin
    height = pitch * (len(text) - 1) + round(1.3 * look.size) + 2 * margin
    paper = _paper(height, width, look, rng)
    canvas = Image.fromarray(paper[..., ::-1].copy())
    pen = ImageDraw.Draw(canvas)
    words = []
    for i, line in enumerate(text):
        origin = (margin + indents[i], margin + i * pitch)
        pen.text(origin, line, font=font, fill=look.ink[::-1])
        words.append(_word_boxes(line, font, origin))
    img = np.asarray(canvas)[..., ::-1].astype(np.float32)
    if look.perspective:
        img, matrix = _perspective(img, look.perspective, rng)
        words = [[(w, _moved(box, matrix)) for w, box in line] for line in words]
    if look.blur:
        img = cv2.GaussianBlur(img, (0, 0), look.blur * look.size)
    if look.noise:
        img += rng.normal(0, look.noise, img.shape).astype(np.float32)
    img = np.clip(np.round(img), 0, 255).astype(np.uint8)
    if look.upside_down:
        turned = np.array([img.shape[1], img.shape[0]], np.float32)
        # Turned 180 degrees, the word's top-left as written is the box's far corner.
        words = [[(w, turned - box) for w, box in line] for line in words]
        img = cv2.rotate(img, cv2.ROTATE_180)
    return img, words


def draw(text: list[str], look: Look, rng: np.random.Generator) -> np.ndarray:
    """The lines drawn as a BGR image."""
    return drawn(text, look, rng)[0]


def _word_boxes(line: str, font: ImageFont.FreeTypeFont, origin: tuple[int, int]) -> list[WordBox]:
    top, bottom = font.getbbox(line)[1::2]
    out, at = [], 0
    for word in line.split(" "):
        if word:
            shift = origin[0] + font.getlength(line[:at])
            left, _, right, _ = font.getbbox(word)
            y0, y1 = origin[1] + top, origin[1] + bottom
            x0, x1 = shift + left, shift + right
            out.append((word, np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32)))
        at += len(word) + 1
    return out


def _moved(box: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    return cv2.perspectiveTransform(box.reshape(1, -1, 2), matrix).reshape(-1, 2)


def _paper(height: int, width: int, look: Look, rng: np.random.Generator) -> np.ndarray:
    start = np.asarray(look.paper, np.float32)
    if look.paper_to is None:
        return np.broadcast_to(start, (height, width, 3)).astype(np.uint8)
    angle = float(rng.uniform(0, 2 * np.pi))
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    along = xs * np.cos(angle) + ys * np.sin(angle)
    t = (along - along.min()) / max(1e-6, float(along.max() - along.min()))
    end = np.asarray(look.paper_to, np.float32)
    return (start + (end - start) * t[..., np.newaxis]).astype(np.uint8)


def _perspective(
    img: np.ndarray, amount: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    h, w = img.shape[:2]
    corners = np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float32)
    moved = (corners + rng.uniform(-amount, amount, (4, 2)) * [w, h]).astype(np.float32)
    matrix = cv2.getPerspectiveTransform(corners, moved)
    warped = cv2.warpPerspective(img, matrix, (w, h), borderMode=cv2.BORDER_REPLICATE)
    return warped, matrix
