"""Composable OpenCV operations: the vocabulary of recipes.

Each operation is a function `op(state, **params)`; recipes name them with
their parameters, and the parameters are checked against the signature when
the configuration loads. Per-image operations map over `state.images`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import cv2
import numpy as np

from preprocess import images as imgs
from preprocess.state import State
from protos.errors import InvalidInput

Op = Callable[..., None]
OPS: dict[str, Op] = {}

_INTERPOLATION = {
    "nearest": cv2.INTER_NEAREST,
    "linear": cv2.INTER_LINEAR,
    "area": cv2.INTER_AREA,
    "cubic": cv2.INTER_CUBIC,
    "lanczos": cv2.INTER_LANCZOS4,
}


CHECKS: dict[str, Callable[[dict], None]] = {}
"""Per operation, a check of its parameters' values beyond the signature (raises ValueError
or TypeError naming the problem): run when the configuration loads, not at the first image."""


def op(fn: Op) -> Op:
    OPS[fn.__name__] = fn
    return fn


PER_IMAGE: set[str] = set()
"""Operations that transform each of `state.images` on its own and touch no tensor: a
recipe may run them one batch row at a time (recipes.py)."""


def per_image(fn: Op) -> Op:
    PER_IMAGE.add(fn.__name__)
    return op(fn)


def checks(name: str) -> Callable[[Callable[[dict], None]], Callable[[dict], None]]:
    """Register the function as the check of operation `name`'s parameters."""

    def register(check: Callable[[dict], None]) -> Callable[[dict], None]:
        CHECKS[name] = check
        return check

    return register


def check_params(name: str, params: dict) -> None:
    """Raise ValueError naming what is wrong with an operation's parameters."""
    if name not in OPS:
        raise ValueError(f"unknown operation '{name}' (known: {', '.join(sorted(OPS))})")
    try:
        inspect.signature(OPS[name]).bind(None, **params)
        if name in CHECKS:
            CHECKS[name](params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"operation '{name}': {exc}") from None
    if "interpolation" in params and params["interpolation"] not in _INTERPOLATION:
        raise ValueError(f"operation '{name}': unknown interpolation '{params['interpolation']}'")


def _each(state: State, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    state.images = [fn(img) for img in state.images]


# ---------------------------------------------------------------- sources


@op
def decode(state: State, input: str = "image", color: str = "bgr", min_pixels: int = 0) -> None:
    """Images from a BYTES tensor of encoded files, or a UINT8 [H,W,C] / [N,H,W,C] tensor.
    `min_pixels`: what the steps after need at least; a JPEG with 4x as many or more is
    decoded at 1/2, 1/4 or 1/8 of its size (libjpeg's own scaling: a 12 Mpx photo in a
    sixth of the time at 1/4), never below it. 0: always whole."""
    if color not in ("bgr", "rgb", "gray"):
        raise ValueError(f"decode: color must be bgr, rgb or gray, not '{color}'")
    tensor = state.tensor(input)
    if tensor.dtype == object:
        items = tensor.reshape(-1)
        if len(items) == 0:
            raise InvalidInput(f"input '{input}' holds no image")
        decoded = [
            imgs.decode_sized(
                bytes(item), f"input '{input}' element {i}", state.limits, color, min_pixels
            )
            for i, item in enumerate(items, state.first)
        ]
        state.images = [img for img, _ in decoded]
        state.sizes = [size for _, size in decoded]
        return
    if tensor.dtype != np.uint8 or tensor.ndim not in (3, 4) or tensor.shape[-1] not in (1, 3):
        raise InvalidInput(
            f"input '{input}': expected encoded images (BYTES) or UINT8 [H,W,C] with C 1 or 3, "
            f"got {tensor.dtype} {list(tensor.shape)}"
        )
    batch = tensor if tensor.ndim == 4 else tensor[np.newaxis]
    if batch.shape[1] * batch.shape[2] > state.limits.max_pixels:
        raise InvalidInput(f"input '{input}' has more than {state.limits.max_pixels} pixels")
    state.images = [imgs.convert(np.ascontiguousarray(img), color) for img in batch]


@op
def unpad(state: State, input: str = "crops", sizes: str = "crop_sizes") -> None:
    """Images from a padded UINT8 [N,H,W,C] batch and its INT32 [N,2] (height, width) sizes."""
    batch, hw = state.tensor(input), state.tensor(sizes)
    if batch.ndim != 4 or hw.shape != (batch.shape[0], 2):
        raise InvalidInput(
            f"inputs '{input}' {list(batch.shape)} and '{sizes}' {list(hw.shape)} "
            "must be [N,H,W,C] and [N,2]"
        )
    if (hw < 1).any() or (hw[:, 0] > batch.shape[1]).any() or (hw[:, 1] > batch.shape[2]).any():
        raise InvalidInput(f"input '{sizes}' has sizes outside the padded images")
    state.images = [batch[i, :h, :w] for i, (h, w) in enumerate(hw.tolist())]


# ---------------------------------------------------------------- per image


@per_image
def color(state: State, to: str) -> None:
    """Convert between gray, bgr and rgb (images are bgr or gray when decoded)."""
    if to not in ("gray", "bgr", "rgb"):
        raise ValueError(f"color: unknown target '{to}'")
    _each(state, lambda im: imgs.convert(im, to))


@per_image
def resize(
    state: State,
    width: int | None = None,
    height: int | None = None,
    keep_aspect: bool = False,
    letterbox: bool = False,
    max_side: int | None = None,
    min_side: int | None = None,
    multiple: int = 1,
    interpolation: str = "linear",
    pad_value: float = 0,
) -> None:
    """Exact (width+height), keep-aspect fit (+letterbox pads to the box), or side limits."""
    flag = _INTERPOLATION[interpolation]

    def one(img: np.ndarray) -> np.ndarray:
        h, w = img.shape[:2]
        if width and height and not keep_aspect:
            target = (width, height)
        elif width and height:
            scale = min(width / w, height / h)
            target = (max(1, round(w * scale)), max(1, round(h * scale)))
        else:
            scale = 1.0
            if max_side and max(h, w) > max_side:
                scale = max_side / max(h, w)
            if min_side and min(h, w) * scale < min_side:
                scale = min_side / min(h, w)
            target = (max(1, round(w * scale)), max(1, round(h * scale)))
        if multiple > 1:
            target = tuple(max(multiple, round(t / multiple) * multiple) for t in target)
        out = cv2.resize(img, target, interpolation=flag) if target != (w, h) else img
        if letterbox and width and height:
            out = _pad_to(out, height, width, pad_value, center=True)
        return out

    _each(state, one)


def _pad_to(img: np.ndarray, height: int, width: int, value: float, center: bool) -> np.ndarray:
    h, w = img.shape[:2]
    top = (height - h) // 2 if center else 0
    left = (width - w) // 2 if center else 0
    out = np.full((height, width, *img.shape[2:]), value, dtype=img.dtype)
    out[top : top + h, left : left + w] = img
    return out


@per_image
def pad(
    state: State,
    width: int | None = None,
    height: int | None = None,
    value: float = 0,
    center: bool = False,
) -> None:
    """Pad right/bottom (or around, `center`) to at least width x height."""
    _each(
        state,
        lambda im: _pad_to(
            im, max(height or 0, im.shape[0]), max(width or 0, im.shape[1]), value, center
        ),
    )


@per_image
def pad_to_square(state: State, value: float = 0) -> None:
    _each(state, lambda im: _pad_to(im, max(im.shape[:2]), max(im.shape[:2]), value, True))


@per_image
def crop(state: State, x: int, y: int, width: int, height: int) -> None:
    def one(img: np.ndarray) -> np.ndarray:
        if x < 0 or y < 0 or x + width > img.shape[1] or y + height > img.shape[0]:
            raise InvalidInput(
                f"crop {width}x{height}+{x}+{y} falls outside a {img.shape[1]}x{img.shape[0]} image"
            )
        return img[y : y + height, x : x + width]

    _each(state, one)


@per_image
def invert(state: State) -> None:
    _each(state, lambda im: 255 - im)


@per_image
def rotate(state: State, angle: int) -> None:
    codes = {90: cv2.ROTATE_90_CLOCKWISE, 180: cv2.ROTATE_180, 270: cv2.ROTATE_90_COUNTERCLOCKWISE}
    if angle not in codes:
        raise ValueError(f"rotate: angle must be 90, 180 or 270, not {angle}")
    _each(state, lambda im: cv2.rotate(im, codes[angle]))


@per_image
def normalize(
    state: State,
    scale: float = 1.0,
    mean: float | Sequence[float] = 0.0,
    std: float | Sequence[float] = 1.0,
) -> None:
    """(pixel * scale - mean) / std, as float32; mean/std per channel or scalar."""
    m = np.asarray(mean, np.float32)
    s = np.asarray(std, np.float32)
    _each(state, lambda im: (im.astype(np.float32) * np.float32(scale) - m) / s)


@per_image
def layout(state: State, order: str = "CHW") -> None:
    if order != "CHW":
        raise ValueError("layout: only CHW is supported (images are HWC)")
    _each(
        state,
        lambda im: im[np.newaxis] if im.ndim == 2 else np.ascontiguousarray(im.transpose(2, 0, 1)),
    )


# ---------------------------------------------------------------- collate


@op
def stack(state: State, output: str, dtype: str = "float32", flatten: bool = False) -> None:
    """The images as one [N, ...] tensor (they must share a shape)."""
    shapes = {im.shape for im in state.images}
    if len(shapes) != 1:
        raise InvalidInput(f"images of different shapes cannot be stacked: {sorted(shapes)}")
    batch = np.stack(state.images).astype(dtype, copy=False)
    state.tensors[output] = batch.reshape(len(batch), -1) if flatten else batch


@op
def stack_padded(state: State, output: str, sizes_output: str) -> None:
    """Images of any size as a zero-padded UINT8 [N,Hmax,Wmax,C] batch plus [N,2] sizes."""
    ims = [im if im.ndim == 3 else im[..., np.newaxis] for im in state.images]
    channels = ims[0].shape[2] if ims else 3
    h = max((im.shape[0] for im in ims), default=1)
    w = max((im.shape[1] for im in ims), default=1)
    state.check_batch(f"'{output}'", (len(ims), h, w, channels), np.uint8)
    batch = np.zeros((len(ims), h, w, channels), np.uint8)
    for i, im in enumerate(ims):
        batch[i, : im.shape[0], : im.shape[1]] = im
    state.tensors[output] = batch
    state.tensors[sizes_output] = np.array([im.shape[:2] for im in ims], np.int32).reshape(-1, 2)
