"""Ink on paper: the operations that turn a photo or scan of a mark into its ink coverage.

scikit-learn's digits were made from binarised scans: each digit's ink box scaled to the
frame with its aspect kept, then the on-pixels counted in 4x4 blocks. Users' images come
with margins, either polarity, grey or coloured paper, uneven light, noise and blur, so the
ink has to be found before it can be framed the same way:

    decode (gray) -> ink -> crop_to_ink -> pad_to_square -> resize (area) -> normalize
"""

from __future__ import annotations

import cv2
import numpy as np

from preprocess.ops import per_image
from preprocess.state import State
from protos.errors import InvalidInput


def _quantile(values: np.ndarray, q: float) -> float:
    """The q-quantile (nearest rank) of an array: a partial sort, ~10x cheaper than
    np.percentile on the few thousand values of a thumbnail."""
    flat = values.reshape(-1)
    k = round(q * (len(flat) - 1))
    return float(np.partition(flat, k)[k])


def _paper(img: np.ndarray) -> tuple[float, float]:
    """The paper's grey level and the noise on it (a robust sigma), from the image's border.

    The border is mostly paper even when the mark touches it (a digit filling its frame
    crosses it at the top and bottom), so its median is the paper. Ink lies on one side of
    the paper only, so the noise is read from the quieter side of the median: up to half
    of the border may be ink without inflating it. A side that holds hardly any of the
    border (paper clipped at white or black) says nothing and is passed over.
    """
    ring = np.concatenate([img[0], img[-1], img[1:-1, 0], img[1:-1, -1]])
    paper = _quantile(ring, 0.5)
    sides = [ring[ring >= paper] - paper, paper - ring[ring <= paper]]
    spreads = [_quantile(s, 0.5) for s in sides if len(s) >= 0.2 * len(ring)]
    return paper, (min(spreads) if spreads else 0.0) / 0.6745


def ink_coverage(
    gray: np.ndarray,
    where: str,
    work_side: int,
    min_contrast: float,
    noise_factor: float,
    floor: float,
    sure_contrast: float = 80.0,
) -> np.ndarray:
    """Ink coverage (0..1, float32) of a gray image, at most `work_side` pixels a side."""
    h, w = gray.shape
    img = gray.astype(np.float32)
    scale = work_side / max(h, w)
    if scale < 1:
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
    img = cv2.GaussianBlur(img, (0, 0), 0.7)
    paper, noise = _paper(img)
    darker, lighter = paper - img, img - paper
    # The ink's strength: a high percentile of the median-filtered difference, so single
    # noisy pixels do not count, for ink darker and for ink lighter than the paper.
    levels = [_quantile(cv2.medianBlur(d, 3), 0.999) for d in (darker, lighter)]
    strength, level = max(zip(levels, (darker, lighter), strict=True), key=lambda t: t[0])
    # Capped: blotchy paper reads as noise, and a dark digit on it came under 6 sigmas (a
    # textured photo in ~2,000 refused, 130 grey levels against 141 needed). Blank paper
    # stays under the cap with pixel noise of sigma 40 or blotches of +-40 levels (at +-60,
    # 7 of 300 pass: stained paper).
    needed = max(min_contrast, min(noise_factor * noise, sure_contrast))
    if strength < needed:
        raise InvalidInput(
            f"{where} has no ink: nothing in it differs from the background by more than "
            f"{strength:.0f} grey levels (at least {needed:.0f} needed; a blank or uniform image)"
        )
    cut = max(3 * noise, floor * strength)
    return np.clip((level - cut) / (strength - cut), 0.0, 1.0)


@per_image
def ink(
    state: State,
    work_side: int = 128,
    min_contrast: float = 24.0,
    noise_factor: float = 6.0,
    floor: float = 0.2,
    sure_contrast: float = 80.0,
) -> None:
    """Gray images -> ink coverage maps (float32, 0 = paper, 1 = full ink).

    The paper is what the border shows; ink is whichever of
    darker or lighter than the paper stands out most. Differences under `floor` of the
    ink's strength (or three noise sigmas) count as paper. An image whose strongest mark is
    under `min_contrast` grey levels (or `noise_factor` noise sigmas, but never more than
    `sure_contrast` levels) has no ink: refused with INVALID_ARGUMENT rather than
    classified. Images are first reduced to `work_side` pixels a side (area averaging),
    which also keeps a photo's cost that of a thumbnail.
    """
    out = []
    for i, img in enumerate(state.images, state.first):
        if img.ndim != 2:
            raise InvalidInput(f"image {i}: ink needs a gray image (decode with color: gray)")
        args = (work_side, min_contrast, noise_factor, floor, sure_contrast)
        out.append(ink_coverage(img, f"image {i}", *args))
    state.images = out


def _span(mass: np.ndarray, trim: float) -> tuple[int, int]:
    """First and past-last index holding all but `trim` of `mass` on either end."""
    cumulative = np.cumsum(mass)
    total = float(cumulative[-1])
    start = int(np.searchsorted(cumulative, trim * total, side="right"))
    stop = int(np.searchsorted(cumulative, (1 - trim) * total, side="left")) + 1
    return start, max(start + 1, min(stop, len(mass)))


@per_image
def crop_to_ink(state: State, trim: float = 0.005) -> None:
    """Crop each ink map to its ink's box: the rows and columns holding all of its ink but
    `trim` on each side (specks of noise far from the mark carry too little to count)."""

    def one(cover: np.ndarray) -> np.ndarray:
        if not cover.any():
            return cover
        y0, y1 = _span(cover.sum(axis=1), trim)
        x0, x1 = _span(cover.sum(axis=0), trim)
        return cover[y0:y1, x0:x1]

    state.images = [one(c) for c in state.images]
